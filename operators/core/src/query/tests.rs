//! Tests of the query types and their configuration.

use super::*;

#[test]
fn decision_names_are_their_serialised_forms_and_each_cause_has_one_step() {
    let name = |value: serde_json::Value| value.as_str().unwrap().to_string();
    for step in [Step::Fuse, Step::Dedup, Step::Mmr, Step::Pack] {
        assert_eq!(name(serde_json::to_value(step).unwrap()), step.as_str());
    }
    for tier in Tier::ALL {
        let action = Action::from(tier);
        assert_eq!(action.as_str(), tier.as_str());
        assert_eq!(name(serde_json::to_value(action).unwrap()), action.as_str());
    }
    for action in [Action::Adapted, Action::Dropped, Action::Deferred] {
        assert_eq!(name(serde_json::to_value(action).unwrap()), action.as_str());
    }
    let causes = [
        Cause::LaneDuplicate,
        Cause::EvidenceRule,
        Cause::Exact,
        Cause::NearDuplicate,
        Cause::DocumentCap,
        Cause::SectionCap,
        Cause::BeyondK,
        Cause::Overlap,
        Cause::OverBudget,
        Cause::Fits,
        Cause::Shortened,
        Cause::BudgetLeft,
        Cause::EvidenceStop,
        Cause::EvidenceBand,
        Cause::EndpointFallback,
        Cause::SurrogatePolicy,
        Cause::TierCap,
    ];
    for cause in causes {
        assert_eq!(name(serde_json::to_value(cause).unwrap()), cause.as_str());
        let decision = Decision::new("id", Action::Dropped, cause, "why");
        assert_eq!(decision.step, cause.step());
        let json = serde_json::to_value(&decision).unwrap();
        assert_eq!(json["step"], cause.step().as_str());
        assert_eq!(json["cause"], cause.as_str());
        assert_eq!(serde_json::from_value::<Decision>(json).unwrap(), decision);
    }
}

#[test]
fn a_query_without_acl_sees_public_chunks_only_unless_the_job_opens_it() {
    let decode = |body: &str| decode::decode_query(body.as_bytes(), 8192).expect("valid");
    let without = r#"{"query_id":"q","tenant":"acme","text":"x"}"#;
    let mut closed = decode(without);
    closed.apply_absent_acl(AbsentAcl::Public);
    assert_eq!(closed.acl, Some(vec![]), "an empty label list: public only");
    assert_eq!(QueryConfig::default().absent_acl, AbsentAcl::Public);
    let mut open = decode(without);
    open.apply_absent_acl(AbsentAcl::All);
    assert_eq!(open.acl, None);
    let mut named = decode(r#"{"query_id":"q","tenant":"acme","text":"x","acl":["eng"]}"#);
    named.apply_absent_acl(AbsentAcl::Public);
    assert_eq!(named.acl, Some(vec!["eng".to_string()]));
}

#[test]
fn the_jobs_similarity_threshold_applies_where_the_query_gives_none() {
    let decode = |body: &str| decode::decode_query(body.as_bytes(), 8192).expect("valid");
    let mut plain = decode(r#"{"query_id":"q","tenant":"acme","text":"x"}"#);
    plain.apply_job_rules(&QueryConfig::default());
    assert_eq!(plain.score_threshold, None, "none by default");
    assert_eq!(plain.acl, Some(vec![]), "the ACL rule applies too");
    let config = QueryConfig {
        similarity_threshold: 0.25,
        ..QueryConfig::default()
    };
    let mut plain = decode(r#"{"query_id":"q","tenant":"acme","text":"x"}"#);
    plain.apply_job_rules(&config);
    assert_eq!(plain.score_threshold, Some(0.25));
    let mut own = decode(r#"{"query_id":"q","tenant":"acme","text":"x","score_threshold":0.5}"#);
    own.apply_job_rules(&config);
    assert_eq!(own.score_threshold, Some(0.5), "the query's own wins");
}
