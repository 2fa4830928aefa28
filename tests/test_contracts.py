"""Contract suites: every implementation of an interface (pearl.contracts) through the same checks.

- every runtime of pearl.runtime.RUNTIMES: the replay ratio exact at the end, the learner never
  ahead of the count due and never more than the runtime's lag bound (plus one round) behind it
  during the run, every committed transition inserted once;
- every learner the builder makes (each algorithm x each kernel its workload has): one update
  against the algorithm's own PyTorch update (the reference), its state loading into every other
  kernel of the algorithm;
- every class that declares a contract has the contract's members.
"""
import copy
import math

import numpy as np
import pytest
import torch

import pearl
from pearl import contracts
from pearl.checkpoint import split_state
from pearl.plan import Plan
from pearl.replay import Batch
from pearl.runtime import RUNTIMES, get

FAST = dict(total_steps=4000, learning_starts=500, target_update_interval=200, hidden=[32, 32])


@pytest.mark.parametrize("name,lag", [(name, None) for name in RUNTIMES] + [("processes", 64)])
@pytest.mark.parametrize("ratio,envs", [(0.25, 1), (2.0, 2)])
def test_runtime_keeps_the_replay_ratio_and_loses_no_transition(name, lag, ratio, envs):
    """`lag`: the processes runtime's deterministic form (Plan.deterministic_lag) as well."""
    runtime = get(name)
    assert isinstance(runtime, contracts.Runtime) and runtime.name == name
    actors = 2 if name == "processes" else 1
    agent = pearl.DQN("CartPole-v1", plan=Plan(runtime=name, actors=actors, envs_per_actor=envs, deterministic_lag=lag),
                      **{**FAST, "updates_per_step": ratio})
    due = agent.parts.schedule.due
    lags = []
    agent.train(2500, on_round=lambda a: lags.append(due(a.env_steps) - a.updates))
    assert agent.updates == due(agent.env_steps)  # exact at the end
    assert lags and min(lags) >= 0, "the learner ran ahead of the replay ratio"
    assert max(lags) <= runtime.max_lag + math.ceil(actors * envs * ratio)
    assert agent.replay.inserted == agent.env_steps  # 1-step transitions: every one inserted
    stored = agent.replay.storage["obs"][:agent.replay.inserted]
    assert len(np.unique(stored, axis=0)) == len(stored)  # none twice


def learner_cases():
    from pearl.estimator.workload import workload_from_config

    for algo, env in (("dqn", "CartPole-v1"), ("ddpg", "Pendulum-v1"), ("td3", "Pendulum-v1"),
                      ("sac", "Pendulum-v1")):
        config = pearl.ExperimentConfig(algo=algo, env=env)
        for kernel in workload_from_config(config).learner_kernels:
            yield algo, env, kernel


def tiny_agent(algo, env, kernel):
    return pearl.make_agent(pearl.config.apply_overrides(pearl.ExperimentConfig(algo=algo, env=env), {
        f"{algo}.hidden": [16, 16], f"{algo}.batch_size": 32, "runtime.learner_kernel": kernel}))


def random_batch(agent, seed: int) -> Batch:
    rng = np.random.default_rng(seed)
    fields = agent.parts.transition_fields
    arrays = {}
    for name, (dtype, shape) in fields.items():
        if name == "actions" and dtype == np.int64:
            arrays[name] = rng.integers(agent.parts.family.n_actions, size=32)
        elif name == "discounts":
            arrays[name] = np.where(rng.random(32) < 0.1, 0.0, 0.99).astype(np.float32)
        else:
            arrays[name] = rng.uniform(-1, 1, (32, *shape)).astype(dtype)
    weights = rng.uniform(0.5, 1.0, 32).astype(np.float32) if agent.parts.family.action_field[1] == () else None
    return Batch(**arrays, indices=np.arange(32), weights=weights)


def flat(module) -> np.ndarray:
    return torch.cat([p.detach().reshape(-1) for p in module.parameters()]).numpy()


@pytest.mark.parametrize("algo,env,kernel", list(learner_cases()))
def test_learner_step_follows_the_reference_update(algo, env, kernel):
    agent = tiny_agent(algo, env, kernel)
    learner = agent.learner
    assert isinstance(learner, contracts.Learner) and learner.kernel == kernel
    # the algorithm's own PyTorch update on a fresh copy (same seed, same initial weights): a learner
    # may take the algorithm's modules over (the fused one makes their parameters views)
    reference = agent.parts.family.algorithm(agent.config)
    batch = random_batch(agent, 0)
    torch.manual_seed(7)  # the same exploration / smoothing noise for both
    loss, abs_td = learner.update(batch)
    tensors = [torch.from_numpy(getattr(batch, f)) for f in ("obs", "actions", "rewards", "next_obs", "discounts")]
    torch.manual_seed(7)
    if algo == "dqn":
        ref_loss, ref_td = reference.update(*tensors, torch.from_numpy(batch.weights))
        np.testing.assert_allclose(abs_td, ref_td.numpy(), rtol=1e-4, atol=1e-6)
        ref_policy = flat(reference.online)
    else:
        ref_loss = reference.update(*tensors)
        assert abs_td is None
        ref_policy = flat(reference.policy_network())
    assert loss == pytest.approx(ref_loss, rel=1e-4)
    weights = learner.policy_weights()
    assert weights.dtype == np.float32 and weights.shape == ref_policy.shape
    np.testing.assert_allclose(weights, ref_policy, rtol=1e-4, atol=1e-6)


@pytest.mark.parametrize("algo,env,kernel", list(learner_cases()))
def test_learner_state_loads_into_every_kernel(algo, env, kernel):
    source = tiny_agent(algo, env, kernel)
    source.learner.update(random_batch(source, 1))
    state = source.learner.state_dict()
    for other in {k for a, _, k in learner_cases() if a == algo}:
        target = tiny_agent(algo, env, other)
        target.learner.load_state_dict(copy.deepcopy(state))
        np.testing.assert_array_equal(target.learner.policy_weights(), source.learner.policy_weights())


@pytest.mark.parametrize("algo,env,kernel", list(learner_cases()))
def test_a_learners_state_is_a_copy_its_updates_leave_alone(algo, env, kernel):
    """A run's checkpoint of a frame table is written while the learner updates on
    (pearl/checkpoint.py start_checkpoint): the state it took must stay what it was."""
    learner = tiny_agent(algo, env, kernel).learner
    state = learner.state_dict()
    kept = copy.deepcopy(state)
    for seed in range(3):
        learner.update(random_batch(tiny_agent(algo, env, kernel), seed))
    _, now = split_state("learner", learner.state_dict())
    _, then = split_state("learner", state)
    _, expected = split_state("learner", kept)
    assert any(not np.array_equal(now[name], expected[name]) for name in expected)  # (the updates changed it)
    for name, values in expected.items():
        np.testing.assert_array_equal(then[name], values, err_msg=name)


def declared_classes():
    """Every class of the package that says which contracts it implements."""
    import importlib
    import pkgutil

    seen = set()
    for package in ("pearl", "pearl.kernels"):
        root = importlib.import_module(package)
        for info in pkgutil.walk_packages(root.__path__, package + "."):
            if any(skip in info.name for skip in ("pearl.cli", "opencl", "fpga", "cuda")):
                continue
            module = importlib.import_module(info.name)
            for value in vars(module).values():
                if isinstance(value, type) and "__contracts__" in vars(value) and value not in seen:
                    seen.add(value)
                    yield value


def test_declared_contracts_are_kept():
    classes = list(declared_classes())
    assert len(classes) >= 10, [c.__name__ for c in classes]  # algorithms, learners, tables, actors, runtimes
    for cls in classes:
        for contract in cls.__contracts__:
            members = [m for m in vars(contract) if not m.startswith("_")] + list(contract.__annotations__)
            missing = [m for m in members if not hasattr(cls, m) and m not in _instance_attributes(cls)]
            assert not missing, f"{cls.__qualname__} declares {contract.__name__} but lacks {missing}"


def _instance_attributes(cls) -> set[str]:
    """Attributes set in __init__ (self.x = ...), found in the source: a Protocol's data members."""
    import inspect
    import re

    names = set()
    for klass in cls.__mro__:
        init = vars(klass).get("__init__")
        if init is not None:
            try:
                names |= set(re.findall(r"self\.(\w+)\s*(?:,\s*self\.\w+\s*)*=", inspect.getsource(init)))
                names |= set(re.findall(r"self\.(\w+)(?=[^=\n]*=[^=])", inspect.getsource(init)))
            except (OSError, TypeError):
                pass
    return names


@pytest.mark.parametrize("name", RUNTIMES)
def test_runtime_has_rate_limiter_room_for_n_step_flushes_of_every_env(name):
    """n_step 3 at 1 update per env step with 8 envs: when every env ends its episode in the same
    round, the round inserts up to envs x n_step transitions; the limiter leaves room for it."""
    agent = pearl.DQN("CartPole-v1", plan=Plan(runtime=name, envs_per_actor=8),
                      **{**FAST, "updates_per_step": 1.0, "n_step": 3, "batch_size": 32})
    agent.train(3000)
    assert agent.updates == agent.parts.schedule.due(agent.env_steps)


@pytest.mark.parametrize("actors", [1, 2, 3])
def test_learning_starts_with_every_actors_n_step_steps_pending(actors):
    """At learning_starts every env of every actor may still hold n_step - 1 steps whose returns
    are not known: the learner's first batch must be allowed with that many fewer inserts (two
    processes-runtime actors with 8 envs at n_step 3 were refused now and then before)."""
    from pearl import schedule
    from pearl.replay.rate_limiter import RateLimiter

    envs, n_step, learning_starts, batch = 8, 3, 1000, 64
    limit = schedule.rate_limit("processes", batch, 0.25, learning_starts, n_step, envs, actors)
    limiter = RateLimiter(limit.samples_per_insert, limit.min_size_to_sample, limit.error_buffer)
    limiter.record_insert(learning_starts - (n_step - 1) * envs * actors)
    assert limiter.can_sample(batch)
