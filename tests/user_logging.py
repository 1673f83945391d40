"""User logging policies for the sweep's ``logging_policy: module:function`` tests."""

import numpy as np


def favour_low_ids(context, item_features):
    """Logits that prefer low item ids, plus a little of the context (numpy)."""
    d = np.asarray(item_features).shape[0]
    return -0.5 * np.arange(d)[None, :] + 0.1 * np.asarray(context)[:, :1]


def wrong_shape(context, item_features):
    return np.zeros((np.asarray(context).shape[0], 2))
