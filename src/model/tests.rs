use super::*;

#[test]
fn statuses_read_back_as_they_are_written_and_nothing_else() {
    for s in Status::ALL {
        assert_eq!(s.as_str().parse::<Status>().unwrap(), s);
        assert_eq!(
            serde_json::to_value(s).unwrap(),
            Value::String(s.as_str().into())
        );
    }
    assert!("done".parse::<Status>().is_err());
    assert_eq!(
        Status::list(),
        "running, succeeded, failed, timed_out, canceled, error"
    );
}

#[test]
fn an_event_body_round_trips_through_its_stored_form_and_keeps_its_json_shape() {
    let bodies = [
        EventBody::Created {
            deadline: DateTime::parse_from_rfc3339("2026-01-02T03:04:05.678Z")
                .unwrap()
                .with_timezone(&Utc),
        },
        EventBody::State {
            from: None,
            to: "on".into(),
        },
        EventBody::Retry {
            error: "the target answered 503".into(),
            attempt: 2,
            delay: "2s".into(),
        },
        EventBody::end(
            Status::Failed,
            Ending {
                reason: "r".into(),
                state: Some("x".into()),
                error_detail: Some(serde_json::json!({"code": 1})),
                last_error: None,
                output: None,
            },
        ),
    ];
    let ending = Ending {
        reason: "r".into(),
        state: None,
        error_detail: None,
        last_error: None,
        output: None,
    };
    let mut kinds: Vec<&str> = bodies[..3].iter().map(EventBody::kind).collect();
    kinds.extend(Status::ENDS.map(|st| EventBody::end(st, ending.clone()).kind()));
    kinds.sort();
    let mut listed = EventBody::KINDS.to_vec();
    listed.sort();
    assert_eq!(kinds, listed, "KINDS lists every kind, as kind() spells it");
    for b in bodies {
        let (kind, data) = b.to_parts();
        assert!(data.get("kind").is_none());
        assert_eq!(EventBody::from_parts(kind, data).unwrap(), b);
    }
    let e = Event {
        id: Some(7),
        seq: 3,
        wait_id: Uuid::nil(),
        // Instants are written to the millisecond, so the round trip starts at one.
        at: DateTime::parse_from_rfc3339("2026-01-02T03:04:05.678Z")
            .unwrap()
            .with_timezone(&Utc),
        body: EventBody::end(
            Status::Canceled,
            Ending {
                reason: "canceled by a client".into(),
                state: None,
                error_detail: None,
                last_error: None,
                output: None,
            },
        ),
    };
    let v = serde_json::to_value(&e).unwrap();
    assert_eq!(v["kind"], "canceled");
    assert_eq!(v["reason"], "canceled by a client");
    assert!(v.get("error_detail").is_none(), "{v}");
    assert_eq!(serde_json::from_value::<Event>(v).unwrap(), e);
}
