//! Amazon MQ: RabbitMQ and ActiveMQ brokers.

use crate::{
    consumers::{Batch, BatchFailed, Delivery, Report, Source},
    Fingerprint,
};
use aws_lambda_events::{
    activemq::{ActiveMqEvent, ActiveMqMessage},
    rabbitmq::{RabbitMqEvent, RabbitMqMessage},
};

/// Amazon MQ for RabbitMQ: the [`Source`] of a [`RabbitMqBatch`].
#[derive(Debug, Clone, Copy)]
pub struct RabbitMq;

/// Amazon MQ for ActiveMQ: the [`Source`] of an [`ActiveMqBatch`].
#[derive(Debug, Clone, Copy)]
pub struct ActiveMq;

/// Processes an Amazon MQ for RabbitMQ batch idempotently and in order per
/// queue.
///
/// - **Order**: the messages of a queue (`queue::vhost`) run one after
///   another in delivery order, and a queue stops at its first message that
///   does not complete. Queues run side by side.
/// - **Retries**: the event source mapping takes no partial batch response,
///   so when a message does not complete [`process`](Batch::process)
///   returns a [`BatchFailed`]: return it from the handler, the invocation
///   fails, and the broker delivers the batch again (`redelivered: true`).
///   The messages that completed replay there instead of running again.
///   Give the queue a dead-letter exchange and a delivery limit, so a
///   poison message cannot come back forever.
/// - **Key**: the message's `messageId` property, which the publisher must
///   set (RabbitMQ does not). A message without one fails with a log line
///   that says so: set it when publishing, or give a business key with
///   [`key`](Batch::key). **Fingerprint**: the message's data only: the
///   broker adds headers to a message it delivers again (`x-death` when it
///   was dead-lettered and came back), so headers are no part of it.
pub type RabbitMqBatch<St> = Batch<RabbitMq, St>;

/// Processes an Amazon MQ for ActiveMQ batch idempotently and in order per
/// destination queue.
///
/// - **Order**: the messages of a destination (`physicalName`) run one
///   after another in delivery order, and a destination stops at its first
///   message that does not complete.
/// - **Retries**: the event source mapping takes no partial batch response,
///   so when a message does not complete [`process`](Batch::process)
///   returns a [`BatchFailed`]: return it from the handler, the invocation
///   fails, and the broker delivers the batch again; the messages that
///   completed replay. The broker's redelivery policy and dead-letter queue
///   bound how often a poison message comes back.
/// - **Key**: the JMS `messageID`, the same on every redelivery; a business
///   key (a JMS property, a field of the data) also catches a producer's
///   second send. **Fingerprint**: the message's data only: properties
///   may be set by the broker on a delivery (a delivery count), so they
///   are no part of it.
pub type ActiveMqBatch<St> = Batch<ActiveMq, St>;

fn data_fingerprint(data: &Option<String>) -> Fingerprint {
    Fingerprint::of_bytes(data.as_deref().unwrap_or_default().as_bytes())
}

impl Source for RabbitMq {
    type Event = RabbitMqEvent;
    type Record = RabbitMqMessage;
    type Output = ();
    const NAME: &'static str = "RabbitMQ";
    const DEFAULT_KEY: &'static str = "the messageId property, which RabbitMQ publishers must set";

    fn deliveries(event: RabbitMqEvent) -> Vec<Delivery<RabbitMqMessage>> {
        // "queue::vhost" → that queue's messages in delivery order.
        super::in_order_by_group(event.messages_by_queue)
    }

    fn id(message: &RabbitMqMessage) -> Option<String> {
        message
            .basic_properties
            .message_id
            .clone()
            .filter(|id| !id.is_empty())
    }

    fn default_key(message: &RabbitMqMessage) -> Option<String> {
        Self::id(message)
    }

    fn default_fingerprint(message: &RabbitMqMessage) -> Result<Fingerprint, String> {
        Ok(data_fingerprint(&message.data))
    }

    fn respond(report: Report) -> Result<(), BatchFailed> {
        report.into_result()
    }
}

impl Source for ActiveMq {
    type Event = ActiveMqEvent;
    type Record = ActiveMqMessage;
    type Output = ();
    const NAME: &'static str = "ActiveMQ";
    const DEFAULT_KEY: &'static str = "the JMS messageID";

    fn deliveries(event: ActiveMqEvent) -> Vec<Delivery<ActiveMqMessage>> {
        event
            .messages
            .into_iter()
            .map(|message| {
                let destination = message.destination.physical_name.clone();
                Delivery::in_order(destination.unwrap_or_default(), message)
            })
            .collect()
    }

    fn id(message: &ActiveMqMessage) -> Option<String> {
        message.message_id.clone().filter(|id| !id.is_empty())
    }

    fn default_key(message: &ActiveMqMessage) -> Option<String> {
        Self::id(message)
    }

    fn default_fingerprint(message: &ActiveMqMessage) -> Result<Fingerprint, String> {
        Ok(data_fingerprint(&message.data))
    }

    fn respond(report: Report) -> Result<(), BatchFailed> {
        report.into_result()
    }
}
