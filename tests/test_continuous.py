"""DDPG, TD3 and SAC: targets and losses against a float64 numpy reference, the agents' runtime
semantics (action scaling, replay ratio, determinism, save/load), config and CLI errors."""
import copy
import json
import subprocess
import sys

import gymnasium as gym
import numpy as np
import pytest
import torch
import yaml

import pearl
from pearl.algos.ddpg import DDPG
from pearl.algos.sac import SAC
from pearl.algos.td3 import TD3
from pearl.config import DDPGConfig, SACConfig, TD3Config, default_config_path, load_config, parse_config
from pearl.errors import ConfigError
from pearl.runtime.continuous import ActionScaler

OBS, ACT, B = 3, 2, 5
FAST = dict(total_steps=2000, learning_starts=100, hidden=[32, 32], batch_size=32)


# -- a float64 numpy reference of the networks ------------------------------------------------------
def np_mlp(module, x):
    """The Sequential of Linear/ReLU layers `module`, in float64."""
    linears = [m for m in module if isinstance(m, torch.nn.Linear)]
    h = np.asarray(x, dtype=np.float64)
    for i, layer in enumerate(linears):
        h = h @ layer.weight.detach().double().numpy().T + layer.bias.detach().double().numpy()
        if i < len(linears) - 1:
            h = np.maximum(h, 0.0)
    return h


def np_q(critic, obs, actions):
    return np_mlp(critic.net, np.concatenate([obs, actions], axis=1))[:, 0]


def tiny_batch(seed=0):
    rng = np.random.default_rng(seed)
    obs = rng.normal(size=(B, OBS)).astype(np.float32)
    actions = rng.uniform(-1, 1, size=(B, ACT)).astype(np.float32)
    rewards = rng.normal(size=B).astype(np.float32)
    next_obs = rng.normal(size=(B, OBS)).astype(np.float32)
    discounts = np.array([0.99, 0.0, 0.99, 0.99, 0.0], dtype=np.float32)  # two terminal transitions
    return obs, actions, rewards, next_obs, discounts


def tensors(*arrays):
    return [torch.from_numpy(a) for a in arrays]


def perturb(*modules, seed=1):
    """Targets different from the online networks, so a test can tell which one a formula used."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for module in modules:
            for p in module.parameters():
                p.add_(0.3 * torch.randn(p.shape, generator=gen))


def test_ddpg_target_and_losses_match_reference():
    algo = DDPG(OBS, ACT, DDPGConfig(hidden=[16, 8]), seed=0)
    perturb(algo.actor_target, algo.critic_target)
    obs, actions, rewards, next_obs, discounts = tiny_batch()
    next_a = np.tanh(np_mlp(algo.actor_target.net, next_obs))
    y = rewards + discounts * np_q(algo.critic_target, next_obs, next_a)
    got = algo.td_target(*tensors(rewards, next_obs, discounts)).numpy()
    np.testing.assert_allclose(got, y, rtol=1e-5, atol=1e-5)
    loss = algo.critic_loss(*tensors(obs, actions, rewards, next_obs, discounts)).item()
    np.testing.assert_allclose(loss, np.mean((np_q(algo.critic, obs, actions) - y) ** 2), rtol=1e-5)
    actor_loss = algo.actor_loss(torch.from_numpy(obs)).item()
    pi = np.tanh(np_mlp(algo.actor.net, obs))
    np.testing.assert_allclose(actor_loss, -np.mean(np_q(algo.critic, obs, pi)), rtol=1e-5)


def test_td3_target_with_smoothing_noise_matches_reference():
    cfg = TD3Config(hidden=[16, 8], target_policy_noise=0.4, target_noise_clip=0.5)
    algo = TD3(OBS, ACT, cfg, seed=0)
    perturb(algo.actor_target, algo.critic_target)
    obs, actions, rewards, next_obs, discounts = tiny_batch()
    noise = np.random.default_rng(7).normal(size=(B, ACT))
    assert np.abs(noise * 0.4).max() > 0.5  # the clip on the noise is exercised
    smoothing = np.clip(noise * 0.4, -0.5, 0.5)
    next_a = np.clip(np.tanh(np_mlp(algo.actor_target.net, next_obs)) + smoothing, -1, 1)
    q1 = np_q(algo.critic_target.q1, next_obs, next_a)
    q2 = np_q(algo.critic_target.q2, next_obs, next_a)
    y = rewards + discounts * np.minimum(q1, q2)
    assert np.any(q1 < q2) and np.any(q2 < q1)  # the min picks from both critics
    got = algo.td_target(*tensors(rewards, next_obs, discounts), noise=torch.from_numpy(noise.astype(np.float32)))
    np.testing.assert_allclose(got.numpy(), y, rtol=1e-5, atol=1e-5)

    # Without `noise`, the draws come from torch's generator: a fixed seed gives the same target
    # as passing the same standard normal draws.
    torch.manual_seed(11)
    drawn = algo.td_target(*tensors(rewards, next_obs, discounts))
    torch.manual_seed(11)
    explicit = algo.td_target(*tensors(rewards, next_obs, discounts), noise=torch.randn(B, ACT))
    torch.testing.assert_close(drawn, explicit)

    loss = algo.critic_loss(*tensors(obs, actions, rewards, next_obs, discounts))  # draws its own noise
    assert loss.item() > 0


def test_td3_delays_the_actor_and_target_updates():
    algo = TD3(OBS, ACT, TD3Config(hidden=[16, 8], policy_delay=2), seed=0)
    batch = tensors(*tiny_batch())
    snapshot = [copy.deepcopy(m.state_dict()) for m in (algo.actor, algo.critic, algo.actor_target)]

    def changed(module, state):
        return any(not torch.equal(v, state[k]) for k, v in module.state_dict().items())
    algo.update(*batch)
    assert changed(algo.critic, snapshot[1])
    assert not changed(algo.actor, snapshot[0]) and not changed(algo.actor_target, snapshot[2])
    algo.update(*batch)
    assert changed(algo.actor, snapshot[0]) and changed(algo.actor_target, snapshot[2])


def test_actor_step_leaves_critic_gradients_alone():
    """The actor's loss runs through the critic; the critic's gradients after an update are those of
    the critic loss alone, and the critic trains again afterwards."""
    algo = DDPG(OBS, ACT, DDPGConfig(hidden=[16, 8]), seed=0)
    batch = tensors(*tiny_batch())
    reference = copy.deepcopy(algo.critic)
    loss = torch.nn.functional.mse_loss(reference(batch[0], batch[1]), algo.td_target(*batch[2:]))
    loss.backward()
    algo.update(*batch)
    for p, q in zip(algo.critic.parameters(), reference.parameters()):
        assert p.requires_grad
        torch.testing.assert_close(p.grad, q.grad)


def np_squashed_sample(actor, obs, noise):
    out = np_mlp(actor.net, obs)
    mean, log_std = out[:, :ACT], np.clip(out[:, ACT:], -20, 2)
    u = mean + np.exp(log_std) * noise
    log_prob = (-0.5 * noise ** 2 - log_std - 0.5 * np.log(2 * np.pi)).sum(1)
    log_prob -= np.log(1 - np.tanh(u) ** 2).sum(1)
    return np.tanh(u), log_prob


def test_sac_target_actor_and_temperature_losses_match_reference():
    cfg = SACConfig(hidden=[16, 8], init_ent_coef=0.3)
    algo = SAC(OBS, ACT, cfg, seed=0)
    perturb(algo.critic_target)
    obs, actions, rewards, next_obs, discounts = tiny_batch()
    noise = np.random.default_rng(3).normal(size=(B, ACT))
    next_a, next_logp = np_squashed_sample(algo.actor, next_obs, noise)
    q = np.minimum(np_q(algo.critic_target.q1, next_obs, next_a), np_q(algo.critic_target.q2, next_obs, next_a))
    y = rewards + discounts * (q - 0.3 * next_logp)
    got = algo.td_target(*tensors(rewards, next_obs, discounts), noise=torch.from_numpy(noise.astype(np.float32)))
    np.testing.assert_allclose(got.numpy(), y, rtol=1e-4, atol=1e-4)

    # log pi of the squashed Gaussian also agrees with torch.distributions' own transform
    mean, log_std = algo.actor(torch.from_numpy(next_obs))
    dist = torch.distributions.TransformedDistribution(
        torch.distributions.Normal(mean.double(), log_std.exp().double()), [torch.distributions.TanhTransform()])
    a, logp = algo.actor.sample(torch.from_numpy(next_obs), torch.from_numpy(noise.astype(np.float32)))
    np.testing.assert_allclose(logp.detach().numpy(), dist.log_prob(a.double()).sum(1).detach().numpy(), rtol=1e-3)

    pi, logp = np_squashed_sample(algo.actor, obs, noise)
    q_pi = np.minimum(np_q(algo.critic.q1, obs, pi), np_q(algo.critic.q2, obs, pi))
    actor_loss, got_logp = algo.actor_loss(torch.from_numpy(obs), torch.from_numpy(noise.astype(np.float32)))
    np.testing.assert_allclose(actor_loss.item(), np.mean(0.3 * logp - q_pi), rtol=1e-4)

    assert algo.target_entropy == -ACT
    temp_loss = algo.temperature_loss(got_logp)
    np.testing.assert_allclose(temp_loss.item(), -np.log(0.3) * np.mean(logp - ACT), rtol=1e-4)
    # One step raises alpha when the policy's entropy (-log pi) is below the target, lowers it above.
    for log_prob, direction in ((torch.full((B,), 5.0), 1), (torch.full((B,), -5.0), -1)):
        algo = SAC(OBS, ACT, cfg, seed=0)
        before = algo.alpha().item()
        algo.temperature_optimizer.zero_grad()
        algo.temperature_loss(log_prob).backward()
        algo.temperature_optimizer.step()
        assert np.sign(algo.alpha().item() - before) == direction


def test_sac_without_autotune_keeps_alpha():
    algo = SAC(OBS, ACT, SACConfig(hidden=[16, 8], autotune=False, init_ent_coef=0.2), seed=0)
    algo.update(*tensors(*tiny_batch()))
    assert algo.alpha().item() == pytest.approx(0.2)


# -- agents ----------------------------------------------------------------------------------------
class TwoDimEnv(gym.Env):
    """A 2-D action env with asymmetric bounds; the reward says how far the action is from a corner,
    and each observation records the env action it was given, so tests can check the scaling."""

    observation_space = gym.spaces.Box(-np.inf, np.inf, (3,), np.float32)
    action_space = gym.spaces.Box(np.array([0.0, -3.0], np.float32), np.array([1.0, 1.0], np.float32))

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.t = 0
        return np.zeros(3, np.float32), {}

    def step(self, action):
        self.t += 1
        assert self.action_space.contains(np.asarray(action, np.float32)), action
        obs = np.array([action[0], action[1], self.t / 10], np.float32)
        return obs, -float(np.sum((action - np.array([1.0, -3.0])) ** 2)), self.t >= 10, False, {}


gym.register("PearlTwoDim-v0", entry_point=TwoDimEnv)


def test_action_scaler_round_trip():
    scaler = ActionScaler([0.0, -3.0], [1.0, 1.0])
    np.testing.assert_allclose(scaler.to_env(np.array([[-1, -1], [1, 1], [0, 0]], np.float32)),
                               [[0, -3], [1, 1], [0.5, -1]])
    a = np.random.default_rng(0).uniform(-1, 1, (10, 2)).astype(np.float32)
    np.testing.assert_allclose(scaler.from_env(scaler.to_env(a)), a, atol=1e-6)


@pytest.mark.parametrize("cls", [pearl.DDPG, pearl.TD3, pearl.SAC])
def test_agent_stores_unit_actions_and_steps_env_in_bounds(cls):
    agent = cls("PearlTwoDim-v0", **FAST)
    agent.train(400)
    assert agent.updates == 400 - 100  # one update per env step after the warm-up
    n = len(agent.replay)
    stored = agent.replay.storage["actions"][:n]
    assert n == 400 and stored.shape == (400, 2) and stored.dtype == np.float32
    assert np.all(np.abs(stored) <= 1) and np.abs(stored).max() > 0.5
    # the env received each stored action scaled to its bounds (it echoes it in the next obs)
    np.testing.assert_allclose(agent.replay.storage["next_obs"][:n, :2], agent.parts.family.scaler.to_env(stored),
                               rtol=1e-5, atol=1e-6)
    assert len(agent.evaluate(1)["returns"]) == 1
    action = agent.act(np.zeros(3))
    assert action.shape == (2,) and 0 <= action[0] <= 1 and -3 <= action[1] <= 1
    batch = agent.act(np.zeros((4, 3)), deterministic=False)
    assert batch.shape == (4, 2) and np.all(batch >= [0, -3]) and np.all(batch <= [1, 1])


def test_n_step_keeps_vector_actions_with_their_observations():
    agent = pearl.SAC("PearlTwoDim-v0", **FAST, n_step=3, gamma=0.9)
    agent.train(400)  # 40 whole episodes: every pending step is flushed
    n = len(agent.replay)
    assert n == 400
    s = agent.replay.storage
    obs, actions, discounts = s["obs"][:n], s["actions"][:n], s["discounts"][:n]
    assert np.all(np.isclose(discounts, 0.0) | np.isclose(discounts, 0.9 ** 3))
    assert np.isclose(discounts, 0.0).sum() == 3 * 40  # the last 3 steps of each episode
    # in time order within an episode, row i's action is echoed in row i+1's observation
    same_episode = np.isclose(obs[1:, 2] - obs[:-1, 2], 0.1)
    assert same_episode.sum() >= 300
    np.testing.assert_allclose(obs[1:][same_episode, :2], agent.parts.family.scaler.to_env(actions[:-1][same_episode]),
                               rtol=1e-5, atol=1e-6)


def test_actor_sends_scaled_actions_to_env():
    agent = pearl.TD3("PearlTwoDim-v0", **FAST)
    actor = agent.actor
    transitions, _ = actor.step(1.0)  # a uniformly random warm-up action
    obs, actions, _, next_obs, _ = transitions
    np.testing.assert_allclose(next_obs[0, :2], agent.parts.family.scaler.to_env(actions[0]), rtol=1e-6)


@pytest.mark.parametrize("cls", [pearl.DDPG, pearl.SAC])
def test_numpy_policy_matches_torch_actor(cls):
    agent = cls("Pendulum-v1", **FAST)
    obs = np.random.default_rng(0).normal(size=(6, 3)).astype(np.float32)
    with torch.no_grad():
        out = agent.algo.actor(torch.from_numpy(obs))
    expected = out if cls is pearl.DDPG else torch.tanh(out[0])
    np.testing.assert_allclose(agent.policy.mean_action(obs), expected.numpy(), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("cls", [pearl.DDPG, pearl.TD3, pearl.SAC])
def test_same_seed_same_run(cls):
    runs = []
    for seed in (3, 3, 4):
        agent = cls("Pendulum-v1", **FAST, seed=seed)
        agent.train(300)
        runs.append(agent.learner.state_dict())
    for key in ("actor", "critic"):
        np.testing.assert_array_equal(runs[0][key], runs[1][key])
        assert not np.array_equal(runs[0][key], runs[2][key])


@pytest.mark.parametrize("cls", [pearl.TD3, pearl.SAC])
def test_save_load_round_trip(tmp_path, cls):
    agent = cls("Pendulum-v1", **FAST)
    agent.train(350)
    agent.save(tmp_path / "agent.npz")
    restored = pearl.load(tmp_path / "agent.npz")
    assert type(restored) is cls
    state, again = agent.learner.state_dict(), restored.learner.state_dict()
    assert state.keys() == again.keys() and state["updates"] == again["updates"] == 250
    for name, value in state.items():
        if isinstance(value, np.ndarray):
            np.testing.assert_array_equal(value, again[name])
    for name, moments in state["optimizers"].items():
        assert moments["steps"] == again["optimizers"][name]["steps"] > 0
        np.testing.assert_array_equal(moments["exp_avg_sq"], again["optimizers"][name]["exp_avg_sq"])
    assert (restored.env_steps, restored.updates) == (agent.env_steps, agent.updates)
    np.testing.assert_array_equal(restored.replay.storage["actions"], agent.replay.storage["actions"])
    assert restored.evaluate(2)["returns"] == agent.evaluate(2)["returns"]
    np.testing.assert_array_equal(restored.act(np.ones(3)), agent.act(np.ones(3)))
    restored.train(50)  # training goes on from the restored optimizer state
    assert restored.updates == 300


def test_shipped_pendulum_configs():
    from importlib import resources

    for algo in ("ddpg", "td3", "sac"):
        path = resources.files("pearl.configs").joinpath(f"pendulum_{algo}.yaml")
        config = load_config(str(path))
        assert config.algo == algo and config.env == "Pendulum-v1"
        agent = pearl.make_agent(config)
        assert type(agent).__name__ == algo.upper()


def test_api_errors_name_the_option():
    with pytest.raises(ConfigError, match="policy_dly: unknown TD3 option"):
        pearl.TD3("Pendulum-v1", policy_dly=3)
    with pytest.raises(ConfigError, match="env: CartPole-v1 has actions Discrete\\(2\\); SAC needs Box actions"):
        pearl.SAC("CartPole-v1")
    with pytest.raises(ConfigError, match="algo: the config is for sac, not td3"):
        pearl.TD3(config=parse_config({"algo": "sac", "env": "Pendulum-v1"}))


def run_cli(*args, cwd=None):
    return subprocess.run([sys.executable, "-m", "pearl.cli", *args], capture_output=True, text=True,
                          cwd=cwd, timeout=300)


def test_cli_trains_td3_with_progress_and_run_dir(tmp_path):
    config = tmp_path / "td3.yaml"
    data = yaml.safe_load((default_config_path().parent / "pendulum_td3.yaml").read_text())
    data["td3"].update(hidden=[32, 32], learning_starts=200)
    data["log"]["interval"] = 200
    data["eval"] = {"episodes": 2, "interval": 0}
    config.write_text(yaml.safe_dump(data))
    run = tmp_path / "run"
    result = run_cli("train", str(config), "--steps", "600", "--run-dir", str(run))
    assert result.returncode == 0, result.stderr
    assert "pearl train: td3 on Pendulum-v1, 600 steps" in result.stderr
    assert "600/600 steps" in result.stderr  # progress lines
    assert "throughput:" in result.stdout and "result: eval return" in result.stdout
    for name in ("config.yaml", "plan.yaml", "metrics.csv", "checkpoint.npz", "learning_curve.png", "result.json"):
        assert (run / name).is_file(), name
    result_json = json.loads((run / "result.json").read_text())
    assert result_json["algo"] == "td3" and result_json["updates"] == 400
    assert load_config(run / "config.yaml").td3.hidden == [32, 32]
    assert type(pearl.load(run)) is pearl.TD3


# -- the fused CPU learner ---------------------------------------------------------------------------
@pytest.mark.parametrize("algo_class,config", [(DDPG, DDPGConfig(hidden=[24, 16], lr=3e-3)),
                                               (TD3, TD3Config(hidden=[24, 16], lr=3e-3))])
def test_fused_learner_follows_the_autograd_update(algo_class, config):
    from pearl.replay import Batch
    from pearl.runtime.continuous import ContinuousLearner
    from pearl.runtime.fused_actor_critic import FusedActorCriticLearner

    reference = ContinuousLearner(algo_class(OBS, ACT, config, seed=2), "cpu")
    fused = FusedActorCriticLearner(algo_class(OBS, ACT, config, seed=2))
    for step_ in range(6):
        arrays = tiny_batch(seed=step_)
        batch = Batch(*arrays, indices=np.arange(B))
        torch.manual_seed(step_)  # the same TD3 smoothing noise for both
        loss_ref, _ = reference.update(batch)
        torch.manual_seed(step_)
        loss_fused, _ = fused.update(batch)
        assert loss_fused == pytest.approx(loss_ref, rel=1e-5)
    ref_state, fused_state = reference.state_dict(), fused.state_dict()
    assert fused_state["updates"] == ref_state["updates"] == 6
    for name in ("actor", "critic", "actor_target", "critic_target"):
        np.testing.assert_allclose(fused_state[name], ref_state[name], rtol=1e-4, atol=1e-6)
    assert not np.allclose(fused_state["actor"], ContinuousLearner(algo_class(OBS, ACT, config, seed=2), "cpu")
                           .state_dict()["actor"])  # it did train
    for name in ("actor", "critic"):
        np.testing.assert_allclose(fused_state["optimizers"][name]["exp_avg"],
                                   ref_state["optimizers"][name]["exp_avg"], rtol=1e-3, atol=1e-7)
    # the torch modules see the fused weights (evaluation and checkpoints read them)
    np.testing.assert_array_equal(fused.policy_weights(),
                                  torch.cat([p.detach().reshape(-1) for p in fused.algo.actor.parameters()]).numpy())


@pytest.mark.parametrize("algo", ["TD3", "SAC"])
def test_fused_and_torch_learner_checkpoints_interchange(tmp_path, algo):
    agent = getattr(pearl, algo)("Pendulum-v1", **FAST)
    assert agent.learner.kernel == "fused"
    agent.train(300)
    agent.save(tmp_path / "fused.npz")
    from pearl.checkpoint import load_checkpoint
    header, _ = load_checkpoint(tmp_path / "fused.npz")
    header["plan"]["learner_kernel"] = "torch"
    restored = pearl.load(tmp_path / "fused.npz", plan=pearl.Plan(**header["plan"]))
    assert restored.learner.kernel == "torch"
    np.testing.assert_array_equal(restored.learner.policy_weights(), agent.learner.policy_weights())
    assert restored.evaluate(1)["returns"] == agent.evaluate(1)["returns"]
    restored.train(50)


def test_mountain_car_continuous_trains():
    agent = pearl.DDPG("MountainCarContinuous-v0", **FAST)
    agent.train(200)
    assert agent.updates == 100 and -1 <= agent.act(np.zeros(2))[0] <= 1


def test_mujoco_task_trains(tmp_path, monkeypatch):
    pytest.importorskip("mujoco")
    monkeypatch.chdir(tmp_path)  # mujoco 4 writes MUJOCO_LOG.TXT (a deprecation warning) into the cwd
    agent = pearl.SAC("HalfCheetah-v5", **{**FAST, "learning_starts": 50})
    assert (agent.parts.family.obs_dim, agent.parts.family.action_dim) == (17, 6)
    agent.train(150)
    assert agent.updates == 100 and agent.replay.storage["actions"][:150].shape == (150, 6)
    assert agent.act(np.zeros(17)).shape == (6,)
