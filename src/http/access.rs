//! Who may use the data routes: the bearer tokens with the tenants and ACL labels each opens (a
//! tenant-bound token's tenant and labels are written into the query it sends), the `Host` values the
//! data routes accept, and the refusal to serve beyond loopback without a token.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use bytes::Bytes;
use http::{HeaderMap, HeaderValue};

/// Refuses to serve on `listen` without tokens when it reaches beyond loopback, unless the
/// configuration says `anonymous = true`.
pub fn check_open(listen: &str, no_tokens: bool, anonymous: bool) -> anyhow::Result<()> {
    use std::net::ToSocketAddrs;
    if !no_tokens || anonymous {
        return Ok(());
    }
    let loopback_only = listen
        .to_socket_addrs()
        .map(|mut addresses| addresses.all(|address| address.ip().is_loopback()))
        .unwrap_or(false);
    if loopback_only {
        return Ok(());
    }
    anyhow::bail!(
        "http.listen = {listen} reaches beyond loopback and no bearer token is set: set the \
         variable named by http.query_token_env (or those of http.tokens), or serve every caller \
         without a token by saying `anonymous = true` in [http]"
    )
}

pub(super) type Tenants = Option<Arc<BTreeSet<String>>>;
/// The ACL labels a token's queries carry (`None`: the labels a request names, unchecked).
pub(super) type Labels = Option<Arc<Vec<String>>>;

/// What a request's token opens.
#[derive(Clone)]
pub(super) struct Access {
    pub(super) tenants: Tenants,
    pub(super) labels: Labels,
}

/// The bearer tokens of the data routes, each with the tenants it may query and, for a tenant-bound
/// token, the ACL labels its queries carry.
/// Deliberately not `Debug`: the tokens are secrets.
#[derive(Default, Clone)]
pub struct QueryTokens {
    /// Each token, what it opens, and the name of its environment variable (what rate limits and
    /// logs know it by; never the token).
    tokens: Vec<(Arc<str>, Access, Arc<str>)>,
}

/// What requests without a token are known by (no token configured).
pub(super) const ANONYMOUS: &str = "anonymous";

/// A request's bearer token did not match.
pub(super) struct Unauthorized;

impl QueryTokens {
    /// The tokens found in the environment: the one named by `every_tenant_env` (every tenant, any
    /// labels), and those of `bound` (variable name → tenants), whose queries carry the labels
    /// `labels` gives the same variable (none: public chunks only). Unset or empty variables are
    /// skipped.
    pub fn from_env(
        every_tenant_env: &str,
        bound: &BTreeMap<String, Vec<String>>,
        labels: &BTreeMap<String, Vec<String>>,
    ) -> Self {
        let read = |name: &str| std::env::var(name).ok().filter(|t| !t.is_empty());
        let mut tokens: Vec<(Arc<str>, Access, Arc<str>)> = Vec::new();
        if let Some(token) = read(every_tenant_env) {
            let access = Access {
                tenants: None,
                labels: None,
            };
            tokens.push((Arc::from(token), access, Arc::from(every_tenant_env)));
        }
        for (name, tenants) in bound {
            if let Some(token) = read(name) {
                let access = Access {
                    tenants: Some(Arc::new(tenants.iter().cloned().collect())),
                    labels: Some(Arc::new(labels.get(name).cloned().unwrap_or_default())),
                };
                tokens.push((Arc::from(token), access, Arc::from(name.as_str())));
            }
        }
        Self { tokens }
    }

    /// No token is configured: every request is served as every tenant.
    pub fn is_empty(&self) -> bool {
        self.tokens.is_empty()
    }

    /// The tenants `request`'s `Authorization: Bearer <token>` opens (`None`: every tenant; also when no
    /// token is configured), and the name the credential is known by (its environment variable, or
    /// [`ANONYMOUS`]). Tokens are compared in constant time.
    pub(super) fn grant_named(
        &self,
        headers: &HeaderMap,
    ) -> Result<(Access, Arc<str>), Unauthorized> {
        if self.tokens.is_empty() {
            let access = Access {
                tenants: None,
                labels: None,
            };
            return Ok((access, Arc::from(ANONYMOUS)));
        }
        // Every byte of the token is compared whatever the given value's length or first difference.
        let equal = |given: &str, token: &str| {
            let given = given.as_bytes();
            let length_differs = u8::from(given.len() != token.len());
            token
                .bytes()
                .enumerate()
                .fold(length_differs, |diff, (at, byte)| {
                    diff | (byte ^ given.get(at).copied().unwrap_or(!byte))
                })
                == 0
        };
        headers
            .get_all(http::header::AUTHORIZATION)
            .iter()
            .filter_map(|value| value.to_str().ok()?.strip_prefix("Bearer "))
            .find_map(|given| {
                self.tokens
                    .iter()
                    .find(|(token, _, _)| equal(given, token))
                    .map(|(_, access, name)| (access.clone(), name.clone()))
            })
            .ok_or(Unauthorized)
    }
}

impl QueryTokens {
    /// `query` as the credential named `credential` ([`Self::grant_named`]'s name) binds it now:
    /// a subscription kept across a restart is checked with this. With no token configured any
    /// credential opens every tenant, as any request would; otherwise a credential no longer
    /// configured, or one that no longer opens the query's tenant or labels, is refused (why).
    pub fn rebind(
        &self,
        credential: &str,
        query: serde_json::Map<String, serde_json::Value>,
    ) -> Result<serde_json::Map<String, serde_json::Value>, String> {
        let access = match self.tokens.is_empty() {
            true => Access {
                tenants: None,
                labels: None,
            },
            false => self
                .tokens
                .iter()
                .find(|(_, _, name)| &**name == credential)
                .map(|(_, access, _)| access.clone())
                .ok_or_else(|| format!("its credential ({credential}) is no longer configured"))?,
        };
        let body = serde_json::to_vec(&query).map_err(|e| e.to_string())?;
        let bound = bind(Bytes::from(body), &access)?;
        match serde_json::from_slice(&bound) {
            Ok(serde_json::Value::Object(query)) => Ok(query),
            _ => Err("its query is not a JSON object".into()),
        }
    }
}

/// The query body as the token allows it: with a tenant-bound token, the body must be a JSON object
/// naming one of its tenants (or none, when the token opens exactly one: that one is filled in), and
/// its `acl` (if any) only labels of the token's; a body without `acl` carries the token's labels
/// (`[]` for a token without labels: chunks without labels only, whatever `query.absent_acl` says).
/// A body that is not a JSON object goes on as it is: the dataflow's decoder refuses it (400, with its
/// DLQ record). Other tokens pass the body as it is. `Err`: why it is refused (403).
pub(super) fn bind(body: Bytes, access: &Access) -> Result<Bytes, String> {
    let (Some(tenants), Some(labels)) = (&access.tenants, &access.labels) else {
        return Ok(body);
    };
    let Ok(mut query) = serde_json::from_slice::<serde_json::Map<String, serde_json::Value>>(&body)
    else {
        return Ok(body);
    };
    // A token of exactly one tenant fills in a tenant the body leaves out.
    if query.get("tenant").is_none() && tenants.len() == 1 {
        if let Some(only) = tenants.iter().next() {
            query.insert("tenant".into(), serde_json::json!(only));
        }
    }
    let tenant = query.get("tenant").and_then(serde_json::Value::as_str);
    if !tenant.is_some_and(|tenant| tenants.contains(tenant)) {
        return Err("this token may not query that tenant".into());
    }
    match query.get("acl") {
        None | Some(serde_json::Value::Null) => {
            query.insert("acl".into(), serde_json::json!(labels.as_slice()));
        }
        Some(serde_json::Value::Array(asked)) => {
            if let Some(wider) = asked.iter().find(|label| {
                !label
                    .as_str()
                    .is_some_and(|l| labels.iter().any(|t| t == l))
            }) {
                return Err(format!("this token may not use the ACL label {wider}"));
            }
        }
        // Not a list: left for the decoder to refuse with its DLQ record.
        Some(_) => {}
    }
    serde_json::to_vec(&query)
        .map(Bytes::from)
        .map_err(|e| format!("cannot re-encode the query: {e}"))
}

/// The `Host` values the data endpoints accept.
#[derive(Debug, Clone)]
pub struct AllowedHosts {
    /// `None`: any host (the configuration listed `*`).
    names: Option<Vec<String>>,
}

impl AllowedHosts {
    /// `configured` as given (`name` or `name:port`, `*` for any); empty: the loopback names.
    pub fn new(configured: &[String]) -> Self {
        if configured.iter().any(|name| name == "*") {
            return Self { names: None };
        }
        let names = if configured.is_empty() {
            vec!["localhost".into(), "127.0.0.1".into(), "[::1]".into()]
        } else {
            configured
                .iter()
                .map(|name| name.to_ascii_lowercase())
                .collect()
        };
        Self { names: Some(names) }
    }

    /// The configured list handed to rmcp's own check (empty: its loopback default; `None`: any
    /// host, the configuration listed `*`).
    #[cfg(feature = "mcp")]
    pub(super) fn for_mcp(configured: &[String]) -> Option<Vec<String>> {
        if configured.iter().any(|name| name == "*") {
            None
        } else {
            Some(configured.to_vec())
        }
    }

    /// Whether `host` (a `Host` header value) is allowed: an entry matches it whole, or its name
    /// part when the entry names no port.
    pub(super) fn allows(&self, host: Option<&HeaderValue>) -> bool {
        let Some(names) = &self.names else {
            return true;
        };
        let Some(host) = host.and_then(|h| h.to_str().ok()) else {
            return false;
        };
        let host = host.to_ascii_lowercase();
        let name = match host.rsplit_once(':') {
            // `[::1]:8080` or `name:8080`; a bare IPv6 literal has no brackets to split at.
            Some((name, port)) if port.bytes().all(|b| b.is_ascii_digit()) && !name.is_empty() => {
                name
            }
            _ => host.as_str(),
        };
        names
            .iter()
            .any(|allowed| *allowed == host || *allowed == name)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn host(value: &str) -> HeaderValue {
        HeaderValue::from_str(value).unwrap()
    }

    #[test]
    fn loopback_hosts_by_default() {
        let hosts = AllowedHosts::new(&[]);
        for allowed in [
            "localhost",
            "localhost:9464",
            "127.0.0.1:1",
            "[::1]:9464",
            "LOCALHOST",
        ] {
            assert!(hosts.allows(Some(&host(allowed))), "{allowed}");
        }
        for refused in [
            "evil.example",
            "evil.example:9464",
            "localhost.evil.example",
            "127.0.0.2",
        ] {
            assert!(!hosts.allows(Some(&host(refused))), "{refused}");
        }
        assert!(!hosts.allows(None), "no Host header");
    }

    #[test]
    fn configured_hosts_replace_loopback_and_a_star_opens_all() {
        let hosts = AllowedHosts::new(&["rag.example.com".into(), "10.0.0.5:9464".into()]);
        assert!(hosts.allows(Some(&host("rag.example.com:443"))));
        assert!(hosts.allows(Some(&host("10.0.0.5:9464"))));
        assert!(
            !hosts.allows(Some(&host("10.0.0.5:80"))),
            "the entry names a port"
        );
        assert!(!hosts.allows(Some(&host("localhost"))));
        let any = AllowedHosts::new(&["*".into()]);
        assert!(any.allows(Some(&host("anything:1"))));
        assert!(any.allows(None));
    }

    #[test]
    fn beyond_loopback_needs_a_token_or_anonymous() {
        assert!(check_open("127.0.0.1:0", true, false).is_ok());
        assert!(check_open("[::1]:0", true, false).is_ok());
        let refused = check_open("0.0.0.0:9464", true, false)
            .unwrap_err()
            .to_string();
        assert!(refused.contains("anonymous = true"), "{refused}");
        assert!(
            check_open("0.0.0.0:9464", false, false).is_ok(),
            "a token is set"
        );
        assert!(
            check_open("0.0.0.0:9464", true, true).is_ok(),
            "said in so many words"
        );
    }

    /// A subscription kept across a restart is bound again by its credential's name: refused
    /// where the credential is gone or no longer opens its tenant or labels.
    #[test]
    fn a_kept_query_is_bound_again_by_its_credential_as_configured_now() {
        let acme = Access {
            tenants: Some(Arc::new(["acme".to_string()].into_iter().collect())),
            labels: Some(Arc::new(vec!["eng".into()])),
        };
        let tokens = QueryTokens {
            tokens: vec![(Arc::from("secret"), acme, Arc::from("ACME_TOKEN"))],
        };
        let query = |value: serde_json::Value| match value {
            serde_json::Value::Object(map) => map,
            _ => unreachable!("an object"),
        };
        let kept = query(serde_json::json!({"tenant": "acme", "text": "x", "acl": ["eng"]}));
        assert_eq!(
            tokens
                .rebind("ACME_TOKEN", kept.clone())
                .map(|q| q["acl"].clone()),
            Ok(serde_json::json!(["eng"]))
        );
        let gone = tokens.rebind("OLD_TOKEN", kept.clone()).unwrap_err();
        assert!(gone.contains("no longer configured"), "{gone}");
        assert!(tokens
            .rebind(ANONYMOUS, kept.clone())
            .is_err_and(|why| why.contains("no longer configured")));
        let other_tenant = query(serde_json::json!({"tenant": "globex", "text": "x"}));
        assert!(tokens.rebind("ACME_TOKEN", other_tenant).is_err());
        let wider = query(serde_json::json!({"tenant": "acme", "text": "x", "acl": ["eng", "hr"]}));
        assert!(tokens
            .rebind("ACME_TOKEN", wider)
            .is_err_and(|why| why.contains("hr")));
        // A job without tokens serves every request as every tenant: kept queries too.
        assert!(QueryTokens::default().rebind("ACME_TOKEN", kept).is_ok());
    }

    #[test]
    fn a_tenant_bound_token_binds_its_tenant_and_its_labels() {
        let access = Access {
            tenants: Some(Arc::new(["acme".to_string()].into_iter().collect())),
            labels: Some(Arc::new(vec!["eng".into(), "ops".into()])),
        };
        let bind = |body: serde_json::Value| {
            bind(Bytes::from(body.to_string()), &access)
                .map(|b| serde_json::from_slice::<serde_json::Value>(&b).unwrap())
        };
        let bound = bind(serde_json::json!({"tenant": "acme", "text": "x"})).unwrap();
        assert_eq!(
            bound["acl"],
            serde_json::json!(["eng", "ops"]),
            "the token's labels"
        );
        let narrowed = bind(serde_json::json!({"tenant": "acme", "acl": ["ops"]})).unwrap();
        assert_eq!(
            narrowed["acl"],
            serde_json::json!(["ops"]),
            "a request may narrow"
        );
        let wider = bind(serde_json::json!({"tenant": "acme", "acl": ["ops", "finance"]}));
        assert!(wider.unwrap_err().contains("finance"), "never widen");
        assert!(bind(serde_json::json!({"tenant": "globex"})).is_err());
        let filled = bind(serde_json::json!({"text": "x"})).unwrap();
        assert_eq!(
            filled["tenant"], "acme",
            "the token's one tenant is filled in"
        );
        // Not an object, not JSON: on as it is, for the decoder to refuse (400 and a DLQ record).
        for refused in [
            &b"[\"not\", \"an\", \"object\"]"[..],
            b"{\"tenant\": \"acme\"",
            b"\xff",
        ] {
            let body = Bytes::copy_from_slice(refused);
            assert_eq!(super::bind(body.clone(), &access).unwrap(), body);
        }
        // A token without labels: public chunks only (an explicit empty list, so that
        // `absent_acl = "all"` cannot open labelled chunks to it), and no label may be named.
        let public = Access {
            tenants: access.tenants.clone(),
            labels: Some(Arc::new(Vec::new())),
        };
        for body in [r#"{"tenant":"acme"}"#, r#"{"tenant":"acme","acl":null}"#] {
            let kept = bind_with(&public, Bytes::from(body));
            assert_eq!(kept.unwrap()["acl"], serde_json::json!([]), "{body}");
        }
        let named = bind_with(&public, Bytes::from(r#"{"tenant":"acme","acl":["eng"]}"#));
        assert!(named.is_err());
        // The every-tenant token passes the body as it is.
        let every = Access {
            tenants: None,
            labels: None,
        };
        let body = Bytes::from(r#"{"tenant":"any","acl":["anything"]}"#);
        assert_eq!(super::bind(body.clone(), &every).unwrap(), body);
    }

    fn bind_with(access: &Access, body: Bytes) -> Result<serde_json::Value, String> {
        super::bind(body, access).map(|b| serde_json::from_slice(&b).unwrap())
    }

    #[test]
    fn tokens_compare_whole() {
        let tokens = QueryTokens {
            tokens: vec![(
                Arc::from("s3cret-token"),
                Access {
                    tenants: None,
                    labels: None,
                },
                Arc::from("TOKEN_ENV"),
            )],
        };
        let ask = |value: &str| {
            let mut headers = HeaderMap::new();
            headers.insert(http::header::AUTHORIZATION, host(value));
            tokens.grant_named(&headers).is_ok()
        };
        assert!(ask("Bearer s3cret-token"));
        for wrong in [
            "Bearer s3cret-toke",
            "Bearer s3cret-token2",
            "Bearer ",
            "s3cret-token",
            "Bearer S3cret-token",
        ] {
            assert!(!ask(wrong), "{wrong}");
        }
        assert!(tokens.grant_named(&HeaderMap::new()).is_err());
    }
}
