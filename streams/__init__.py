"""What happens online (faust-streaming): failure detection per episode, incremental failure
clustering. Each processing unit is a pure class tested without a broker; ``streams.app`` wires
them into thin faust agents."""
