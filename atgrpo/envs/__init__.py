"""Turn-based multi-agent text environments (pure Python, no torch)."""

from .base import PROMPT_STYLES, Messages, MultiAgentEnv, Reward, StepResult
from .code import CodeEnv
from .code_review import CodeReviewEnv
from .math_env import MathEnv
from .math_verify import MathVerifyEnv
from .plan_path import PlanPathEnv
from .registry import check_env, make, register, registered
from .sokoban import SokobanEnv
from .sudoku import SudokuEnv

register("code", CodeEnv, "Code: coder + unit tester write and test a stdin/stdout program, run in a sandbox")
register("code_review", CodeReviewEnv, "Code, three roles: coder + unit tester + reviewer (APPROVE ends the "
         "episode, REVISE sends the program back)")
register("math", MathEnv, "Math: tool agent (Python) + reasoner (\\boxed{}) answer a problem; math-verify checks")
register("math_verify", MathVerifyEnv, "Math, three roles: tool agent + reasoner + verifier (accepts, or sends the "
         "answer back with a reason)")
register("plan_path", PlanPathEnv, "Plan-Path: tool agent + plan agent reach a goal on a grid with walls")
register("sokoban", SokobanEnv, "Sokoban: tool agent + plan agent push boxes onto goals in a generated room")
register("sudoku", SudokuEnv, "Sudoku: tool agent + plan agent complete a 4x4 or 9x9 puzzle, unique solution")

__all__ = ["PROMPT_STYLES", "Messages", "MultiAgentEnv", "Reward", "StepResult", "CodeEnv", "CodeReviewEnv", "MathEnv", "MathVerifyEnv", "PlanPathEnv",
           "SokobanEnv", "SudokuEnv", "check_env", "make", "register", "registered"]
