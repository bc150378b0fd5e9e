"""The names of the algorithm's options, without torch: the config's typed choices come from here, so they are
checked before anything heavy loads."""

from typing import Literal, get_args

GroupKey = Literal["problem_turn_agent", "problem", "problem_agent", "problem_turn"]  # grouping.GROUP_KEYS
Aggregation = Literal["token-mean", "seq-mean"]
KLEstimator = Literal["k1", "k2", "k3"]

AGGREGATIONS = get_args(Aggregation)
KL_ESTIMATORS = get_args(KLEstimator)
