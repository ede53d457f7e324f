//! `Retry-After`: delay-seconds or an HTTP-date (RFC 9110 §10.2.3).

use std::time::SystemTime;

use hookwise_core::policy::Seconds;

/// The wait `value` asks for, seen at `now`; a date in the past asks for none.
pub fn parse_retry_after(value: &str, now: SystemTime) -> Option<Seconds> {
    let value = value.trim();
    if let Ok(secs) = value.parse::<u64>() {
        return Some(secs as Seconds);
    }
    let at = httpdate::parse_http_date(value).ok()?;
    Some(at.duration_since(now).map(|d| d.as_secs_f64()).unwrap_or(0.0))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn given_delay_seconds_then_they_are_read_as_is() {
        assert_eq!(parse_retry_after("120", SystemTime::now()), Some(120.0));
        assert_eq!(parse_retry_after(" 0 ", SystemTime::now()), Some(0.0));
    }

    #[test]
    fn given_an_http_date_then_the_wait_is_the_time_until_it() {
        let now = httpdate::parse_http_date("Sun, 06 Nov 1994 08:49:37 GMT").unwrap();
        assert_eq!(parse_retry_after("Sun, 06 Nov 1994 08:51:37 GMT", now), Some(120.0));
        // The obsolete formats a server may still send.
        assert_eq!(parse_retry_after("Sunday, 06-Nov-94 08:50:37 GMT", now), Some(60.0));
        assert_eq!(parse_retry_after("Sun, 06 Nov 1994 08:40:00 GMT", now), Some(0.0));
        assert_eq!(
            parse_retry_after("Sun, 06 Nov 1994 08:49:37 GMT", now + Duration::from_secs(5)),
            Some(0.0)
        );
    }

    #[test]
    fn given_garbage_or_a_negative_number_then_there_is_no_wait() {
        assert_eq!(parse_retry_after("soon", SystemTime::now()), None);
        assert_eq!(parse_retry_after("-5", SystemTime::now()), None);
        assert_eq!(parse_retry_after("", SystemTime::now()), None);
    }
}
