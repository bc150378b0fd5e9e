"""Turn-based multi-agent text environments (pure Python, no torch)."""

from .base import PROMPT_STYLES, Messages, MultiAgentEnv, Reward, StepResult
from .plan_path import PlanPathEnv
from .registry import check_env, make, register, registered

register("plan_path", PlanPathEnv, "Plan-Path: tool agent + plan agent reach a goal on a grid with walls")

__all__ = ["PROMPT_STYLES", "Messages", "MultiAgentEnv", "Reward", "StepResult", "PlanPathEnv", "check_env",
           "make", "register", "registered"]
