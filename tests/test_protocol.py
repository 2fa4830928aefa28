"""Tasks declare inputs, outputs and per-call costs; Plans round-trip through YAML."""
import pytest
import torch

import pearl
from pearl.errors import ConfigError
from pearl.estimator import mlp_forward_cost, mlp_parameter_count
from pearl.protocol import TASK_NAMES, Plan, load_plan


def tasks_of(**options):
    return pearl.DQN("CartPole-v1", **options).tasks


def test_uniform_replay_has_no_priority_task():
    tasks = tasks_of()
    assert set(tasks) == set(TASK_NAMES) - {"update_priorities"}
    assert set(tasks_of(replay="prioritized")) == set(TASK_NAMES)


def test_costs_follow_the_config():
    small, big = tasks_of(batch_size=32), tasks_of(batch_size=128)
    assert big["learn"].cost.flops == pytest.approx(4 * small["learn"].cost.flops, rel=0.05)
    assert big["sample"].cost.bytes == 4 * small["sample"].cost.bytes
    assert small["act"].cost == mlp_forward_cost([4, 64, 64, 2], 1)
    assert small["sync_weights"].cost.bytes == 4 * mlp_parameter_count([4, 64, 64, 2])
    vanilla, double = tasks_of(double=False), tasks_of(double=True)
    assert vanilla["learn"].cost.flops < double["learn"].cost.flops  # no Q(s') forward on the online net


def test_calls_per_env_step_keep_the_replay_ratio():
    tasks = tasks_of(updates_per_step=0.5, envs_per_actor=4)
    assert tasks["learn"].calls_per_env_step == 0.5
    assert tasks["sample"].calls_per_env_step == 0.5
    assert tasks["act"].calls_per_env_step == 0.25  # one call steps 4 envs
    assert tasks["act"].cost == mlp_forward_cost([4, 64, 64, 2], 4)


def test_plan_round_trip(tmp_path):
    plan = Plan(devices={**Plan().devices, "learn": "cuda:0"}, envs_per_actor=8, batch_size=256,
                sync_interval=4, learner_kernel="torch")
    plan.save(tmp_path / "plan.yaml")
    assert load_plan(tmp_path / "plan.yaml") == plan
    assert Plan.from_yaml(plan.to_yaml()) == plan


@pytest.mark.parametrize("text,message", [
    ("devices: {}", "expected a mapping with a 'plan' section"),
    ("plan: {devices: {learn: gpu}}", "plan.devices.learn: expected a device"),
    ("plan: {devices: {think: cpu}}", "plan.devices.think: unknown task"),
    ("plan: {actors: 0}", "plan.actors: expected an integer >= 1"),
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
    ({"act": "fpga:0"}, "plan.devices.act: fpga:0 has no act kernel for dqn (act runs on cpu, or opencl:N"),
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
