"""Learning to rank from relevance labels and clicks: the exposure paper's losses
([`exposure_losses`][opl_rank.ltr.exposure_losses]) and LTR training ([`training`][opl_rank.ltr.training]), and
the pairwise paper's unbiased pairwise loss ([`pairwise`][opl_rank.ltr.pairwise],
[`pairwise_training`][opl_rank.ltr.pairwise_training])."""

from opl_rank.ltr import exposure_losses, pairwise, pairwise_training, training

__all__ = ["exposure_losses", "pairwise", "pairwise_training", "training"]
