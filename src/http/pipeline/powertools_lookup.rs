//! The lookup of Powertools' records, during a migration from Powertools
//! for AWS Lambda: a request a Powertools function answered is answered
//! from its record, and one it abandoned is taken over.

use crate::http::config::Settings;
#[cfg(feature = "powertools")]
use crate::http::{body::Kind, config::Config, lambda_context, metrics::HttpOutcome, respond};
#[cfg(feature = "powertools")]
use crate::store::Store;
#[cfg(feature = "powertools")]
use http::{Request, Response};

#[cfg(feature = "powertools")]
use super::LayerBody;

/// Whether requests are checked against Powertools' records first.
pub(super) fn reads_powertools(settings: &Settings) -> bool {
    #[cfg(feature = "powertools")]
    return settings.powertools.is_some();
    #[cfg(not(feature = "powertools"))]
    {
        let _ = settings;
        false
    }
}

/// The answer Powertools' record gives `request`, in compatibility mode
/// (`Err`), or that this crate's protocol runs (`Ok`), as the takeover of
/// an abandoned Powertools record if it found one: not read with
/// idempotency off, nor for a key (`scope`, `key`) this instance answers
/// from its cache (that holds this crate's own outcome).
#[cfg(feature = "powertools")]
pub(super) async fn powertools_first<St, E, ResBody>(
    config: &Config<St>,
    request: &Request<bytes::Bytes>,
    kind: Kind,
    scoped_key: Option<(&str, &str)>,
    grpc: bool,
) -> Result<Option<crate::Takeover>, (HttpOutcome, Result<Response<ResBody>, E>)>
where
    St: Store,
    ResBody: LayerBody,
{
    use crate::http::powertools::{answer, Answer, Delivery};
    let Some(compat) = config.settings.powertools.as_ref() else {
        return Ok(None);
    };
    let skips = match scoped_key {
        Some((scope, key)) => config.engine.skips_powertools(scope, Some(key)),
        None => config.engine.skips_powertools("", None),
    };
    if skips {
        return Ok(None);
    }
    let delivery = Delivery {
        base64_body: kind.delivered_base64(),
        query: lambda_context::event_query_parameters(request),
        infers_plain_responses: lambda_context::infers_plain_responses(request),
    };
    let started = config.engine.observed_start();
    match answer(compat, request, delivery).await {
        Answer::Run(takeover) => Ok(takeover),
        Answer::Answered(found) => {
            // Answered without the engine's run: reported here, as the
            // engine reports its own answers.
            if let Some(started) = started {
                use crate::observe::{Answer, Port};
                let answer = match &found {
                    Ok(_) => Answer::Outcome(crate::OutcomeKind::Replay),
                    Err(error) => Answer::Error(error.kind()),
                };
                let port = if grpc { Port::Grpc } else { Port::Http };
                config.engine.report(port, started, answer);
            }
            Err(respond::powertools(&config.settings, found, grpc))
        }
    }
}
