"""The names of the loss options, without torch: the config validates against them before anything heavy loads."""

AGGREGATIONS = ("token-mean", "seq-mean")
KL_ESTIMATORS = ("k1", "k2", "k3")
