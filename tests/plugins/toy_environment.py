"""A new simulator defined outside the package, registered for the sweep on import.

Two-slot rankings of D items with additive expected rewards ``q_l(x, a) = s_{a_l} / l`` for
fixed item scores ``s`` (uniform on [0, score_scale]; ``score_scale`` is the simulator's own
option, so a sweep can make it an axis), contexts that carry no information, and a uniform
logging policy. It uses the library's rollout helpers; V* is the reward model's own best
ranking. Its factory takes neither lambda nor tau: it has no interactions and logs uniformly.
"""

import dataclasses

import jax
import jax.numpy as jnp
from flax import struct

from opl_rank.data import LoggedData
from simulators import environments
from simulators.rollout import evaluate_policy, rollout_logging_policy


class ToyRewards(struct.PyTreeNode):
    score: jax.Array  # [D]

    def expected_reward(self, context, rankings):
        slot = jnp.arange(1, rankings.shape[-1] + 1, dtype=jnp.float32)
        return self.score[rankings] / slot.reshape((1,) * (rankings.ndim - 1) + slot.shape)

    def sample_reward(self, key, context, rankings):
        return self.expected_reward(context, rankings) + 0.1 * jax.random.normal(key, rankings.shape)

    def best_rankings(self, context, position_weight, *, n_items, **_):
        best = jnp.argsort(-self.score)[: position_weight.shape[0]].astype(jnp.int32)
        return jnp.broadcast_to(best, (context.shape[0], best.shape[0])), "exact"


@dataclasses.dataclass(frozen=True)
class ToyEnvironment:
    reward_model: ToyRewards
    n_items: int
    ranking_length: int
    position_weight: jax.Array

    def _contexts(self, key, n):
        return jax.random.normal(key, (n, 2))

    def sample_logged_data(self, key, n, *, position_marginals="none"):
        arrays = rollout_logging_policy(
            key,
            n,
            sample_contexts=self._contexts,
            logging_logits=lambda x: jnp.zeros((x.shape[0], self.n_items)),
            reward_model=self.reward_model,
            n_items=self.n_items,
            n_slots=self.ranking_length,
            position_marginals=position_marginals,
        )
        return LoggedData(position_weight=self.position_weight, n_items=self.n_items, **arrays)

    def policy_value(self, policy, key, n_contexts=100_000):
        return evaluate_policy(
            policy,
            key,
            n_contexts,
            sample_contexts=self._contexts,
            reward_model=self.reward_model,
            position_weight=self.position_weight,
            n_items=self.n_items,
        )

    def logging_policy_value(self, key, n_contexts=100_000):
        from opl_rank.pl import plackett_luce as pl

        uniform = lambda k, x: pl.sample_rankings(k, jnp.zeros((x.shape[0], self.n_items)), self.ranking_length)
        return self.policy_value(uniform, key, n_contexts)

    def optimal_value(self, key, n_contexts=20_000):
        best = lambda k, x: self.reward_model.best_rankings(x, self.position_weight, n_items=self.n_items)[0]
        return self.policy_value(best, key, n_contexts), "exact"


def create(key, *, n_items, ranking_length, logging_policy, config, score_scale):
    score = score_scale * jax.random.uniform(key, (n_items,))
    return ToyEnvironment(ToyRewards(score), n_items, ranking_length, jnp.ones(ranking_length, jnp.float32))


environments.register(
    "toy", environments.EnvironmentSpec(create, logging_policies=("uniform",), options={"score_scale": 1.0})
)
