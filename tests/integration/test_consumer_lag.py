"""Consumer lag against the real brokers: committed offsets against the Fetch high watermark
(Tansu's ListOffsets under-reports when the last batch holds several records)."""

import time

from confluent_kafka import Consumer, Producer

from infra.lag import consumer_lag, partition_watermarks


def test_lag_is_the_unread_messages_of_each_group(broker, prefix):
    topic = f"{prefix}rollout.steps"
    producer = Producer({"bootstrap.servers": broker, "linger.ms": 100})  # several records per batch
    for i in range(120):
        producer.produce(topic, key=f"ep-{i % 9}".encode(), value=b"x")
    producer.flush()
    assert sum(high - low for (t, _), (low, high) in partition_watermarks(broker, [topic]).items()) == 120
    group = f"lag-{prefix}"
    consumer = Consumer({"bootstrap.servers": broker, "group.id": group, "enable.auto.commit": False,
                         "auto.offset.reset": "earliest", "session.timeout.ms": 6000})
    consumer.subscribe([topic])
    read = []
    deadline = time.monotonic() + 30
    while len(read) < 50 and time.monotonic() < deadline:
        read += [m for m in consumer.consume(10, 0.5) if not m.error()]
    consumer.commit(asynchronous=False)  # everything consumed so far
    consumer.close()
    (lag,) = consumer_lag(broker, groups=[group], topic_prefix=prefix)
    assert lag.group == group and lag.lag == 120 - len(read)
    assert lag.by_topic() == {topic: 120 - len(read)}
    assert all(p.committed is not None or p.lag == p.end - p.low for p in lag.partitions)
    assert group in {g.group for g in consumer_lag(broker, topic_prefix=prefix)}
