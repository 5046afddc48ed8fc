"""Errors raised while starting, reaching or stopping infrastructure."""


class InfraError(Exception):
    """Root of every infrastructure error."""


class BrokerError(InfraError):
    """The Kafka-compatible broker could not be started, reached or stopped."""


class BrokerUnreachable(BrokerError):
    """The broker did not answer within the bounded wait; names the address tried."""


class KafkaLauncherError(BrokerError):
    """The Apache Kafka test broker could not be fetched or started."""


class PipelineError(InfraError):
    """A background pipeline process could not be started, found or stopped."""


class NotRunning(PipelineError):
    """A process a command relies on (the pipeline, the rollout worker) is not running."""


class LockBusy(InfraError):
    """Another `sepa-eval up` or `down` holds the memory dir's lock beyond the wait."""


class WaitTimeout(InfraError):
    """Events a command waits for did not land in the evidence log in time; names what is missing."""


class RequestRefused(InfraError):
    """A rollout worker dead-lettered a request a command waits on; carries its reason."""


class LiberoSetupError(InfraError):
    """The LIBERO venv could not be built, or is not (completely) set up."""


class LeRobotSetupError(InfraError):
    """The LeRobot venv could not be built, or is not (completely) set up."""


class ReviewRefused(InfraError):
    """A review decision the evidence log does not allow: an unknown scenario, one not awaiting
    review, or one reviewed already (a scenario gets one ReviewDecided)."""


class GateBusy(InfraError):
    """A streams worker runs the promotion gate for this memory dir: a second gate must not decide."""


class OutOfSpace(InfraError):
    """The disk under the memory dir is full."""
