"""The fused SAC learner (pearl/runtime/fused_actor_critic.py FusedSACLearner) against SAC's own
autograd update (pearl/algos/sac.py through ContinuousLearner): same draws, same losses, weights,
Adam moments and temperature; its checkpoints interchange with the autograd learner's; its bf16
products within bfloat16's rounding."""
import numpy as np
import pytest
import torch

import pearl
from pearl.algos.sac import SAC
from pearl.config import SACConfig
from pearl.replay import Batch
from pearl.runtime.continuous import ContinuousLearner
from pearl.runtime.fused_actor_critic import FusedSACLearner

OBS, ACT, B = 3, 2, 32


def batch(seed: int) -> Batch:
    rng = np.random.default_rng(seed)
    arrays = (rng.normal(size=(B, OBS)).astype(np.float32), rng.uniform(-1, 1, size=(B, ACT)).astype(np.float32),
              rng.normal(size=B).astype(np.float32), rng.normal(size=(B, OBS)).astype(np.float32),
              np.where(rng.random(B) < 0.2, 0.0, 0.99).astype(np.float32))
    return Batch(*arrays, indices=np.arange(B))


@pytest.mark.parametrize("autotune", [True, False])
def test_fused_sac_follows_the_autograd_update(autotune):
    config = SACConfig(hidden=[24, 16], lr=3e-3, autotune=autotune, init_ent_coef=0.5)
    reference = ContinuousLearner(SAC(OBS, ACT, config, seed=2), "cpu")
    fused = FusedSACLearner(SAC(OBS, ACT, config, seed=2))
    for step in range(6):
        torch.manual_seed(step)  # the same policy draws for both
        loss_ref, _ = reference.update(batch(step))
        torch.manual_seed(step)
        loss_fused, _ = fused.update(batch(step))
        assert loss_fused == pytest.approx(loss_ref, rel=1e-5)
    ref_state, fused_state = reference.state_dict(), fused.state_dict()
    assert set(fused_state) == set(ref_state) and fused_state["updates"] == ref_state["updates"] == 6
    for name in ("actor", "critic", "critic_target", "temperature"):
        np.testing.assert_allclose(fused_state[name], ref_state[name], rtol=1e-4, atol=1e-6, err_msg=name)
    untrained = ContinuousLearner(SAC(OBS, ACT, config, seed=2), "cpu").state_dict()
    assert not np.allclose(fused_state["actor"], untrained["actor"])  # it did train
    assert (fused_state["temperature"] != untrained["temperature"]).all() == autotune
    for name in ("actor", "critic", "temperature"):
        np.testing.assert_allclose(fused_state["optimizers"][name]["exp_avg"],
                                   ref_state["optimizers"][name]["exp_avg"], rtol=1e-3, atol=1e-7, err_msg=name)


def test_fused_sac_bf16_stays_near_float32():
    config = SACConfig(hidden=[64, 48], lr=1e-5)
    fp32 = FusedSACLearner(SAC(OBS, ACT, config, seed=4))
    bf16 = FusedSACLearner(SAC(OBS, ACT, config, seed=4), "bf16")
    for step in range(3):
        losses = []
        for learner in (fp32, bf16):
            torch.manual_seed(step)
            losses.append(learner.update(batch(step))[0])
        assert losses[1] == pytest.approx(losses[0], rel=1e-3)
        for net in ("actor", "critic"):
            a, b = fp32.grads[net].numpy(), bf16.grads[net].numpy()
            cosine = a @ b / (np.linalg.norm(a) * np.linalg.norm(b))
            assert 0.98 < cosine < 1.0 - 1e-9, (net, cosine)  # close, and not float32


def test_sac_agent_builds_the_fused_learner():
    # its checkpoints interchange with the autograd learner's: tests/test_continuous.py
    agent = pearl.SAC("Pendulum-v1", total_steps=2000, learning_starts=100, hidden=[32, 32], batch_size=32)
    assert type(agent.learner) is FusedSACLearner and agent.learner.kernel == "fused"
