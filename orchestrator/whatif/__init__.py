"""The speculative what-if: from arms of one drafter at two or more step counts, `fit` the cost and acceptance
models, `predict` every step count with CIs and pick one, and put it in words (`text`); `arms` gathers the data.
"""

__all__ = ["arms", "fit", "predict", "text"]
