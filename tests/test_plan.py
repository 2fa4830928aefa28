"""Plans round-trip through YAML; bad plans and unrunnable placements are one-line errors."""
import pytest
import torch

import pearl
from pearl.errors import ConfigError
from pearl.plan import Plan, load_plan


def test_plan_round_trip(tmp_path):
    plan = Plan(devices={**Plan().devices, "learn": "cuda:0"}, envs_per_actor=8, batch_size=256,
                sync_interval=4, learner_kernel="torch", learner_threads=2)
    plan.save(tmp_path / "plan.yaml")
    assert load_plan(tmp_path / "plan.yaml") == plan
    assert Plan.from_yaml(plan.to_yaml()) == plan


@pytest.mark.parametrize("text,message", [
    ("devices: {}", "expected a mapping with a 'plan' section"),
    ("plan: {devices: {learn: gpu}}", "plan.devices.learn: expected a device"),
    ("plan: {devices: {think: cpu}}", "plan.devices.think: unknown task"),
    ("plan: {actors: 0}", "plan.actors: expected an integer >= 1"),
    ("plan: {learner_threads: 0}", "plan.learner_threads: expected an integer >= 1"),
    ("plan: {learner_threads: two}", "plan.learner_threads: expected an integer"),
    ("plan: {batch_size: big}", "plan.batch_size: expected an integer"),
    ("plan: {colour: red}", "plan.colour: unknown key"),
])
def test_bad_plans(text, message):
    with pytest.raises(ConfigError, match=message.replace("(", r"\(").replace(")", r"\)")):
        Plan.from_yaml(text)


def test_plan_naming_a_device_without_kernels_is_refused():
    plan = Plan(devices={**Plan().devices, "sample": "opencl:0"})
    with pytest.raises(ConfigError, match="plan.devices.sample: opencl:0 has no sample kernel for uniform replay"):
        pearl.DQN("CartPole-v1", plan=plan)


@pytest.mark.parametrize("devices,message", [
    ({"act": "fpga:0"}, "plan.devices.act: fpga:0 has no act kernel for dqn (act runs on cpu or opencl:N)"),
    ({"sample": "cuda:0", "insert": "cuda:0", "update_priorities": "cuda:0"},
     "plan.devices.learn: a replay on cuda:0 feeds a learner on the same device" if torch.cuda.is_available()
     else "plan.devices.sample: cuda:0 requested but torch sees no CUDA GPU"),
    ({"sample": "opencl:0"}, "plan.devices.insert: must be the sample device (opencl:0)"),
])
def test_plan_replay_devices_are_checked(devices, message):
    plan = Plan(devices={**Plan().devices, **devices})
    with pytest.raises(ConfigError, match=message.replace("(", r"\(").replace(")", r"\)")):
        pearl.DQN("CartPole-v1", plan=plan, replay="prioritized")


def test_amper_has_no_gpu_kernel():
    gpu = {"sample": "cuda:0", "insert": "cuda:0", "update_priorities": "cuda:0", "learn": "cuda:0"}
    with pytest.raises(ConfigError, match="plan.devices.insert: cuda:0 has no insert kernel for amper replay"):
        pearl.DQN("CartPole-v1", plan=Plan(devices={**Plan().devices, **gpu}), replay="amper")


# -- a given plan and the config: no silent winner ------------------------------------------------
def test_plan_fields_left_unset_come_from_the_config():
    agent = pearl.DQN("CartPole-v1", plan=Plan(), learner_kernel="torch", batch_size=32, replay="prioritized")
    assert (agent.plan.learner_kernel, agent.plan.batch_size, agent.plan.replay) == ("torch", 32, "prioritized")
    assert agent.learner.kernel == "torch"
    assert agent.config.dqn.batch_size == 32 and agent.config.replay.kind == "prioritized"


@pytest.mark.parametrize("plan,options,message", [
    (Plan(batch_size=64), dict(batch_size=32), "plan.batch_size: 64, but the config's dqn.batch_size is 32"),
    (Plan(learner_kernel="fused"), dict(learner_kernel="torch"),
     "plan.learner_kernel: fused, but the config's runtime.learner_kernel is torch"),
    (Plan(envs_per_actor=4), dict(envs_per_actor=2), "plan.envs_per_actor: 4, but the config's runtime.envs_per_actor is 2"),
    (Plan(replay="amper"), dict(replay="prioritized"), "plan.replay: amper, but the config's replay.kind is prioritized"),
    (Plan(learner_threads=2), dict(torch_threads=3),
     "plan.learner_threads: 2, but the config's runtime.torch_threads is 3"),
    (Plan(devices={"learn": "cpu"}), dict(device="cuda"), "plan.devices.learn: cpu, but the config's runtime.device is cuda"),
])
def test_a_plan_and_a_config_that_disagree_stop_in_one_line(plan, options, message):
    with pytest.raises(ConfigError, match=message) as err:
        pearl.DQN("CartPole-v1", plan=plan, **options)
    assert "\n" not in str(err.value)


def test_the_plan_decides_what_the_config_left_at_its_default(tmp_path):
    plan = Plan(devices={"learn": "cpu"}, envs_per_actor=2, batch_size=32, learner_kernel="torch", replay="amper")
    agent = pearl.DQN("CartPole-v1", plan=plan, total_steps=1200, learning_starts=500)
    agent.train(run_dir=tmp_path)
    assert agent.learner.kernel == "torch" and agent.replay.approximate and len(agent.parts.actor.envs) == 2
    # the run directory's config and plan agree
    config = pearl.load_config(tmp_path / "config.yaml")
    saved = load_plan(tmp_path / "plan.yaml")
    assert (config.runtime.envs_per_actor, config.dqn.batch_size, config.runtime.learner_kernel,
            config.replay.kind) == (2, 32, "torch", "amper")
    assert (saved.envs_per_actor, saved.batch_size, saved.learner_kernel, saved.replay) == (2, 32, "torch", "amper")
    assert pearl.load(tmp_path).plan == saved


def test_the_plans_learner_threads_set_torchs_threads(tmp_path):
    before = torch.get_num_threads()
    try:
        agent = pearl.DQN("CartPole-v1", plan=Plan(learner_threads=2), learner_kernel="torch")
        assert agent.plan.learner_threads == 2 and agent.config.runtime.torch_threads == 2
        assert torch.get_num_threads() == 2
        # unset in the plan: the config's
        agent = pearl.DQN("CartPole-v1", plan=Plan(), torch_threads=3)
        assert agent.plan.learner_threads == 3 and torch.get_num_threads() == 3
    finally:
        torch.set_num_threads(before)


def test_cli_plan_and_flag_that_disagree_stop_in_one_line(tmp_path):
    import subprocess
    import sys

    plan = tmp_path / "plan.yaml"
    Plan(devices={"learn": "cpu"}).save(plan)
    result = subprocess.run([sys.executable, "-m", "pearl.cli", "train", "--plan", str(plan), "--device", "cuda",
                             "--steps", "10", "--run-dir", str(tmp_path / "run")], capture_output=True, text=True)
    assert result.returncode == 2
    assert result.stderr.strip() == ("pearl: error: plan.devices.learn: cpu, but the config's runtime.device is cuda: "
                                     "make them agree or leave one unset")
    assert not (tmp_path / "run").exists()  # nothing half-written
