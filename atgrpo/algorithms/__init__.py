"""Pure functions for the math of AT-GRPO: group keys, advantages, losses (imports only torch)."""
