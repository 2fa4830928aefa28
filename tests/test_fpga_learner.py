"""The FPGA learner (kernels/fpga/learner.py: the MLP forward and training-step kernels, C-simulated)
against the fused CPU learner: same updates within float32 tolerance, and CartPole learned with it."""
from __future__ import annotations

import numpy as np
import pytest

import pearl
from pearl.kernels.fpga import SimDevice, build
from pearl.platforms import load_platform

pytestmark = pytest.mark.skipif(not build.available(), reason="no C++ compiler for the HLS C-simulation")


def rel_err(got, want):
    want = np.asarray(want, np.float64)
    return float(np.max(np.abs(np.asarray(got, np.float64) - want)) / np.max(np.abs(want)))


def test_fpga_learner_follows_the_fused_learner():
    from pearl.kernels.fpga.learner import FPGALearner
    from pearl.replay.base import Batch
    from pearl.runtime.learners import FusedCPULearner

    agent = pearl.DQN("CartPole-v1", seed=3, hidden=[32, 32])
    fused = FusedCPULearner(agent.algo)
    fpga = FPGALearner(agent.algo, SimDevice(load_platform("alveo_u250")), batch_size=64)
    np.testing.assert_array_equal(fpga.policy_weights(), fused.policy_weights())
    rng = np.random.default_rng(0)
    for step in range(6):
        batch = Batch(obs=rng.standard_normal((64, 4)).astype(np.float32), actions=rng.integers(0, 2, 64),
                      rewards=np.ones(64, np.float32), next_obs=rng.standard_normal((64, 4)).astype(np.float32),
                      discounts=np.where(rng.random(64) < 0.1, 0, 0.99).astype(np.float32), indices=np.arange(64),
                      weights=(0.5 + rng.random(64)).astype(np.float32))
        loss_fused, td_fused = fused.update(batch)
        loss_fpga, td_fpga = fpga.update(batch)
        assert loss_fpga == pytest.approx(loss_fused, rel=1e-5)
        assert rel_err(td_fpga, td_fused) <= 1e-5
        assert rel_err(fpga.policy_weights(), fused.policy_weights()) <= 1e-5
        if step == 2:
            fused.update_target()
            fpga.update_target()
    state = fpga.state_dict()
    assert state["steps"] == 6 and rel_err(state["exp_avg"], fused.state_dict()["exp_avg"]) <= 1e-4
    again = FPGALearner(agent.algo, SimDevice(load_platform("alveo_u250")), batch_size=64)
    again.load_state_dict(state)
    np.testing.assert_array_equal(again.policy_weights(), state["online"])


def test_fpga_learner_refuses_what_the_kernels_cannot_run():
    from pearl.errors import ConfigError
    from pearl.kernels.fpga.learner import FPGALearner

    dueling = pearl.DQN("CartPole-v1", dueling=True)
    with pytest.raises(ConfigError, match="dueling"):
        FPGALearner(dueling.algo, SimDevice(load_platform("alveo_u250")), batch_size=64)
    rmsprop = pearl.DQN("CartPole-v1", optimizer={"kind": "rmsprop"})
    with pytest.raises(ConfigError, match="steps Adam, not rmsprop"):
        FPGALearner(rmsprop.algo, SimDevice(load_platform("alveo_u250")), batch_size=64)
    wide = pearl.DQN("CartPole-v1", hidden=[512])
    with pytest.raises(ConfigError, match="width 256"):
        FPGALearner(wide.algo, SimDevice(load_platform("alveo_u250")), batch_size=64)


@pytest.mark.slow
def test_replay_and_learner_on_the_simulated_fpga_learn_cartpole():
    """configs/cartpole_dqn.yaml, prioritized replay on fpga:0 and the learn task on the FPGA
    learner, both on one simulated U250."""
    from pearl.config import default_config_path, load_config
    from pearl.kernels.registry import backend, parse_device

    config = pearl.config.apply_overrides(load_config(default_config_path()), {"replay.kind": "prioritized"})
    plan = pearl.Plan(devices={**pearl.Plan().devices, "sample": "fpga:0", "insert": "fpga:0",
                               "update_priorities": "fpga:0"})
    agent = pearl.DQN(config=config, plan=plan)
    agent.learner = backend("fpga").learner(parse_device("fpga:0"), agent.algo, agent.plan.batch_size,
                                            load_platform("alveo_u250"))
    summary = agent.train()
    assert summary["fpga"]["simulated"] is True
    assert set(summary["fpga"]["kernel_calls"]) == {"pearl_sumtree", "pearl_mlp_forward", "pearl_mlp_train_step"}
    assert agent.evaluate(10)["mean"] >= 475
