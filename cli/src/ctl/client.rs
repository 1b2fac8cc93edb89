//! The HTTP client of roced's REST API: requests with the token, JSON in and out, roced's
//! refusals as failures with their exit status.

use super::*;

/// A failure: what to print and the exit status.
pub(crate) struct Fail(pub(crate) u8, pub(crate) String);

/// The API over HTTP.
pub(crate) struct Client {
    base: String,
    agent: ureq::Agent,
    /// `Bearer <token>`, when a token is given.
    auth: Option<String>,
}

impl Client {
    pub(crate) fn with<B>(&self, r: ureq::RequestBuilder<B>) -> ureq::RequestBuilder<B> {
        match &self.auth {
            Some(a) => r.header("authorization", a),
            None => r,
        }
    }

    pub(crate) fn new(addr: &str, token: Option<&str>) -> Client {
        let agent: ureq::Agent = ureq::Agent::config_builder()
            .http_status_as_error(false)
            .timeout_global(Some(Duration::from_secs(60)))
            // A roced that does not accept the connection within 5 s is not there (a firewall
            // dropping the SYNs would otherwise hold every call for the global minute).
            .timeout_connect(Some(Duration::from_secs(5)))
            .build()
            .into();
        Client {
            base: format!("http://{addr}"),
            agent,
            auth: token.map(|t| format!("Bearer {t}")),
        }
    }

    pub(crate) fn call(
        &self,
        method: &str,
        path: &str,
        body: Option<Value>,
    ) -> Result<Value, Fail> {
        let url = format!("{}{path}", self.base);
        let r = match (method, body) {
            ("GET", _) => self.with(self.agent.get(&url)).call(),
            ("DELETE", _) => self.with(self.agent.delete(&url)).call(),
            ("PUT", Some(b)) => self
                .with(self.agent.put(&url))
                .header("content-type", "application/json")
                .send(b.to_string()),
            (_, Some(b)) => self
                .with(self.agent.post(&url))
                .header("content-type", "application/json")
                .send(b.to_string()),
            (_, None) => self.with(self.agent.post(&url)).send(""),
        };
        let mut r = r.map_err(|e| {
            Fail(
                2,
                format!(
                    "cannot reach roced at {} ({e}); is it running, and is --api right?",
                    self.base
                ),
            )
        })?;
        let status = r.status().as_u16();
        let text = r.body_mut().read_to_string().unwrap_or_default();
        let v: Value = if text.is_empty() {
            Value::Null
        } else {
            serde_json::from_str(&text).unwrap_or(Value::String(text))
        };
        if (200..300).contains(&status) {
            Ok(v)
        } else {
            let code = v["code"].as_str().unwrap_or("error");
            let msg = v["message"]
                .as_str()
                .map_or_else(|| v.to_string(), String::from);
            // The request too: a command of several calls (perf) says which one failed.
            let path = path.split('?').next().unwrap_or(path);
            Err(Fail(
                1,
                format!("{code}: {msg} (HTTP {status} to {method} {path})"),
            ))
        }
    }

    pub(crate) fn read_bytes(&self, key: u32, addr: u64, len: u64) -> Result<Vec<u8>, Fail> {
        let url = format!("{}/v1/mrs/{key}/data?addr={addr}&length={len}", self.base);
        let mut r = self
            .with(self.agent.get(&url))
            .call()
            .map_err(|e| Fail(2, format!("cannot reach roced at {} ({e})", self.base)))?;
        let status = r.status().as_u16();
        let body = r
            .body_mut()
            .with_config()
            .limit(1 << 30)
            .read_to_vec()
            .map_err(|e| Fail(2, e.to_string()))?;
        if (200..300).contains(&status) {
            Ok(body)
        } else {
            let v: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
            Err(Fail(
                1,
                format!("{}: {} (HTTP {status})", s(&v["code"]), s(&v["message"])),
            ))
        }
    }

    pub(crate) fn write_bytes(&self, key: u32, addr: u64, data: &[u8]) -> Result<(), Fail> {
        let url = format!("{}/v1/mrs/{key}/data?addr={addr}", self.base);
        let mut r = self
            .with(self.agent.put(&url))
            .header("content-type", "application/octet-stream")
            .send(data)
            .map_err(|e| Fail(2, format!("cannot reach roced at {} ({e})", self.base)))?;
        let status = r.status().as_u16();
        if (200..300).contains(&status) {
            Ok(())
        } else {
            let v: Value = serde_json::from_str(&r.body_mut().read_to_string().unwrap_or_default())
                .unwrap_or(Value::Null);
            Err(Fail(
                1,
                format!("{}: {} (HTTP {status})", s(&v["code"]), s(&v["message"])),
            ))
        }
    }
}
