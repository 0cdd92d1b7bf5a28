//! A real headless browser for the tests: Debian's `chromium`, driven over WebDriver by its
//! `chromedriver` (`scripts/install-deps.sh` installs both). Loopback only.

use std::{
    path::Path,
    process::Stdio,
    time::{Duration, Instant},
};

use base64::Engine as _;
use serde_json::{Value, json};

/// How long chromedriver may take to listen, and a browser to start.
const START_TIMEOUT: Duration = Duration::from_secs(60);

/// A chromedriver process and one headless Chromium session; dropped, both end.
#[derive(Debug)]
pub struct Browser {
    http: reqwest::Client,
    session: String,
    base: String,
    driver: tokio::process::Child,
    _profile: tempfile::TempDir,
}

impl Browser {
    /// Starts chromedriver on a free loopback port and a headless Chromium under it.
    pub async fn start() -> Result<Self, String> {
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .map_err(|e| format!("a free port: {e}"))?
            .port();
        let driver = tokio::process::Command::new("chromedriver")
            .arg(format!("--port={port}"))
            .arg("--allowed-ips=127.0.0.1")
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            // Chromium's processes join this group, so that a test that panics ends them all.
            .process_group(0)
            .kill_on_drop(true)
            .spawn()
            .map_err(|e| {
                format!("chromedriver: {e} (scripts/install-deps.sh installs chromium-driver)")
            })?;
        let base = format!("http://127.0.0.1:{port}");
        let http = reqwest::Client::builder()
            .no_proxy()
            .build()
            .map_err(|e| e.to_string())?;
        let deadline = Instant::now() + START_TIMEOUT;
        loop {
            let ready = http.get(format!("{base}/status")).send().await;
            if let Ok(response) = ready
                && let Ok(status) = response.json::<Value>().await
                && status["value"]["ready"] == true
            {
                break;
            }
            if Instant::now() > deadline {
                return Err(format!(
                    "chromedriver did not listen on {base} within {START_TIMEOUT:?}"
                ));
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        let profile = tempfile::tempdir().map_err(|e| e.to_string())?;
        let capabilities = json!({"capabilities": {"alwaysMatch": {
            "browserName": "chrome",
            "goog:chromeOptions": {
                "binary": "/usr/bin/chromium",
                "args": [
                    "--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                    "--window-size=1280,1100", "--no-proxy-server", "--disable-breakpad",
                    "--disable-crash-reporter",
                    format!("--user-data-dir={}", profile.path().display()),
                ],
            },
        }}});
        let created: Value = http
            .post(format!("{base}/session"))
            .json(&capabilities)
            .timeout(START_TIMEOUT)
            .send()
            .await
            .map_err(|e| format!("a Chromium session: {e}"))?
            .json()
            .await
            .map_err(|e| format!("a Chromium session: {e}"))?;
        let session = created["value"]["sessionId"]
            .as_str()
            .ok_or_else(|| format!("a Chromium session: {created}"))?
            .to_owned();
        Ok(Self {
            http,
            session,
            base,
            driver,
            _profile: profile,
        })
    }

    async fn command(&self, method: reqwest::Method, path: &str, body: Value) -> Value {
        let url = format!("{}/session/{}/{path}", self.base, self.session);
        let mut request = self.http.request(method, &url);
        if !body.is_null() {
            request = request.json(&body);
        }
        let response: Value = request
            .send()
            .await
            .unwrap_or_else(|e| panic!("WebDriver {path}: {e}"))
            .json()
            .await
            .unwrap_or_else(|e| panic!("WebDriver {path}: {e}"));
        if response["value"]["error"].is_string() {
            panic!("WebDriver {path}: {response}");
        }
        response["value"].clone()
    }

    pub async fn open(&self, url: &str) {
        self.command(reqwest::Method::POST, "url", json!({"url": url}))
            .await;
    }

    /// Runs `script` (a function body) in the page and returns what it returns.
    pub async fn eval(&self, script: &str) -> Value {
        self.command(
            reqwest::Method::POST,
            "execute/sync",
            json!({"script": script, "args": []}),
        )
        .await
    }

    /// Saves what the browser shows as a PNG.
    pub async fn screenshot(&self, to: &Path) {
        let png = self
            .command(reqwest::Method::GET, "screenshot", Value::Null)
            .await;
        let png = base64::engine::general_purpose::STANDARD
            .decode(png.as_str().unwrap_or_default())
            .expect("WebDriver sends a screenshot as base64");
        std::fs::write(to, png).unwrap_or_else(|e| panic!("{}: {e}", to.display()));
    }

    /// Ends the session, which ends Chromium, then chromedriver.
    pub async fn close(self) {
        let url = format!("{}/session/{}", self.base, self.session);
        let _ = self.http.delete(url).send().await;
    }
}

impl Drop for Browser {
    /// Kills chromedriver's process group: Chromium too, however the test ended.
    fn drop(&mut self) {
        if let Some(pid) = self.driver.id() {
            let _ = std::process::Command::new("kill")
                .args(["-KILL", "--", &format!("-{pid}")])
                .stderr(Stdio::null())
                .status();
        }
    }
}
