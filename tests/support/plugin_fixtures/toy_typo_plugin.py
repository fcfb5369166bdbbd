"""An always-on plugin with a misspelled hook name: it must be refused, alone."""

from detlaunch import JobResult, StageContext, hookimpl


@hookimpl
def detlaunch_job_finishd(ctx: StageContext, result: JobResult) -> None:
    """Misspelled (job_finishd): no such hook."""
