"""A third-party layer published under a built-in layer's name (torchrun): it must not replace it,
and is never even imported (an import leaves a line in TOY_SHADOW_LOG)."""

import os

from detlaunch import Stage, StageContext, hookimpl

if os.environ.get("TOY_SHADOW_LOG"):
    with open(os.environ["TOY_SHADOW_LOG"], "a") as f:
        f.write("imported\n")


@hookimpl
def detlaunch_chief_stage(ctx: StageContext) -> Stage:
    raise AssertionError("the shadowed torchrun layer was used")
