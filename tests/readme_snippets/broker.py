"""RabbitMQ helper for tests/readme_snippets.sh, run with examples/python's virtualenv (pika).

  broker.py publish QUEUE KEYS SEED  declares QUEUE afresh and publishes KEYS payments, each twice
                                     (message_id = its key), shuffled; prints the expected sum
  broker.py status QUEUE             prints "READY CONSUMERS" (unacked messages are not ready)
  broker.py delete QUEUE
"""
import json
import os
import random
import sys
from decimal import Decimal

import pika

url = os.environ.get("AMQP_URL", "amqp://guest:guest@127.0.0.1:5672")
connection = pika.BlockingConnection(pika.URLParameters(url))
channel = connection.channel()
command, queue = sys.argv[1], sys.argv[2]

if command == "publish":
    keys, seed = int(sys.argv[3]), int(sys.argv[4])
    channel.queue_delete(queue)
    channel.queue_declare(queue, durable=True)
    channel.confirm_delivery()
    payments = [(f"order-{i:03d}:paid", f"order-{i:03d}", Decimal(i * 1025) / 100) for i in range(1, keys + 1)]
    messages = payments * 2
    random.Random(seed).shuffle(messages)
    for key, order_id, amount in messages:
        body = json.dumps({"order_id": order_id, "amount": float(amount)})
        channel.basic_publish("", queue, body,
                              pika.BasicProperties(message_id=key, delivery_mode=2,
                                                   content_type="application/json"),
                              mandatory=True)
    print(sum(amount for _, _, amount in payments))
elif command == "status":
    ok = channel.queue_declare(queue, passive=True)
    print(ok.method.message_count, ok.method.consumer_count)
elif command == "delete":
    channel.queue_delete(queue)
else:
    sys.exit(f"unknown command {command}")
connection.close()
