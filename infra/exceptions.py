"""Errors raised while starting, reaching or stopping infrastructure."""


class InfraError(Exception):
    """Root of every infrastructure error."""


class BrokerError(InfraError):
    """The Kafka-compatible broker could not be started, reached or stopped."""


class KafkaLauncherError(BrokerError):
    """The Apache Kafka test broker could not be fetched or started."""


class PipelineError(InfraError):
    """A background pipeline process could not be started, found or stopped."""


class LiberoSetupError(InfraError):
    """The LIBERO venv could not be built, or is not (completely) set up."""
