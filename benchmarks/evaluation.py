"""Shared by the end-to-end benchmarks: a rival's greedy returns on the initial states PEARL uses.

PEARL's `agent.evaluate` resets episode i with seed `seed + 1_000_003 + i`; a rival's policy is
evaluated on exactly those starts, so the two returns differ by the policies only (a return can
depend strongly on the start: Pendulum's ranges from ~-120 near the top to ~-360 from the worst
angle and speed).
"""
import gymnasium as gym


def sb3_greedy_returns(model, env_id: str, seed: int, episodes: int) -> list[float]:
    env = gym.make(env_id)
    returns = []
    for episode in range(episodes):
        obs, _ = env.reset(seed=seed + 1_000_003 + episode)
        total, done = 0.0, False
        while not done:
            action, _ = model.predict(obs, deterministic=True)
            obs, reward, terminated, truncated, _ = env.step(action)
            total += float(reward)
            done = terminated or truncated
        returns.append(total)
    env.close()
    return returns
