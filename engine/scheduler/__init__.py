from loraplex.engine.scheduler.output import ModelRunnerOutput, ScheduledRequest, SchedulerOutput
from loraplex.engine.scheduler.scheduler import Scheduler

__all__ = ["ModelRunnerOutput", "ScheduledRequest", "Scheduler", "SchedulerOutput"]
