"""Plans round-trip through YAML; bad plans and unrunnable placements are one-line errors."""
import pytest
import torch

import pearl
from pearl.errors import ConfigError
from pearl.plan import Plan, load_plan


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
