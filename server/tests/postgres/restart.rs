//! PostgreSQL restarted mid-request: the test starts its own `postgres` (from
//! /usr/lib/postgresql/*/bin, in a temporary directory, on a free port, as the `postgres` user
//! when run as root), stops it (immediate shutdown) while a keyed handler is in its
//! transaction, and starts it again. The request gets 503 and nothing was applied; the
//! service comes back on its own, and the same key then runs once.

use std::path::PathBuf;
use std::process::Command;
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::pg::{client, fresh, post, serve};
use bytes::Bytes;
use http::{Request, Response, StatusCode};
use http_body_util::{Either, Full};
use hyper::body::Incoming;
use tokio::sync::Notify;
use tower::{service_fn, BoxError, ServiceBuilder};
use tower_idempotency_keys::{stores::PostgresStore, IdempotencyLayer, KeyTransaction, RequestKey};

/// A PostgreSQL of the test's own; stopped and its directory removed when dropped.
struct OwnPostgres {
    bin: PathBuf,
    dir: PathBuf,
    port: u16,
}

impl OwnPostgres {
    fn bin() -> PathBuf {
        let mut found: Vec<PathBuf> = std::fs::read_dir("/usr/lib/postgresql")
            .expect("PostgreSQL's binaries under /usr/lib/postgresql/*/bin")
            .filter_map(Result::ok)
            .map(|e| e.path().join("bin"))
            .filter(|p| p.join("initdb").exists())
            .collect();
        found.sort();
        found
            .pop()
            .expect("an initdb under /usr/lib/postgresql/*/bin")
    }

    /// `args` run as the `postgres` user if this process is root (initdb refuses root).
    fn run(&self, program: &str, args: &[&str]) -> std::process::Output {
        let program = self.bin.join(program);
        let root = Command::new("id")
            .arg("-u")
            .output()
            .is_ok_and(|o| o.stdout.starts_with(b"0\n"));
        let mut command = if root {
            let mut c = Command::new("runuser");
            c.args(["-u", "postgres", "--"]).arg(program);
            c
        } else {
            Command::new(program)
        };
        command.args(args).output().unwrap()
    }

    fn start() -> OwnPostgres {
        let dir = std::env::temp_dir().join(fresh("trs-own-pg"));
        std::fs::create_dir(&dir).unwrap();
        let _ = Command::new("chown")
            .args(["postgres:postgres"])
            .arg(&dir)
            .output();
        // Below the ephemeral range: while it is stopped, no port-0 listener of another test
        // takes its port before it starts again there.
        let port = retry_safety_testing::ports::free_port();
        let pg = OwnPostgres {
            bin: Self::bin(),
            dir,
            port,
        };
        let data = pg.data();
        let init = pg.run(
            "initdb",
            &["-D", &data, "-A", "trust", "-U", "postgres", "--no-sync"],
        );
        assert!(init.status.success(), "initdb: {init:?}");
        pg.up();
        pg
    }

    fn data(&self) -> String {
        self.dir.join("data").display().to_string()
    }

    fn up(&self) {
        let options = format!(
            "-p {} -k {} -c listen_addresses=127.0.0.1 -c fsync=off",
            self.port,
            self.dir.display()
        );
        let log = self.dir.join("log").display().to_string();
        let started = self.run(
            "pg_ctl",
            &[
                "-D",
                &self.data(),
                "-o",
                &options,
                "-l",
                &log,
                "-w",
                "start",
            ],
        );
        assert!(started.status.success(), "pg_ctl start: {started:?}");
    }

    /// Immediate shutdown: every session is cut, as in a crash.
    fn down(&self) {
        let stopped = self.run("pg_ctl", &["-D", &self.data(), "-m", "immediate", "stop"]);
        assert!(stopped.status.success(), "pg_ctl stop: {stopped:?}");
    }

    fn url(&self) -> String {
        format!("postgres://postgres@127.0.0.1:{}/postgres", self.port)
    }
}

impl Drop for OwnPostgres {
    fn drop(&mut self) {
        let _ = self.run("pg_ctl", &["-D", &self.data(), "-m", "immediate", "stop"]);
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

type Req = Request<Either<Full<Bytes>, Incoming>>;

/// Writes an order, says so, waits for `go`, answers 201.
async fn handler(
    waited: Arc<std::sync::atomic::AtomicBool>,
    wrote: Arc<Notify>,
    go: Arc<Notify>,
    req: Req,
) -> Result<Response<Full<Bytes>>, BoxError> {
    let key = req
        .extensions()
        .get::<RequestKey>()
        .cloned()
        .ok_or("no key")?;
    let tx = KeyTransaction::of(&req).cloned().ok_or("no transaction")?;
    let mut conn = tx.acquire().await?;
    sqlx::query("INSERT INTO orders (key, note) VALUES ($1, 'x')")
        .bind(key.as_str())
        .execute(&mut *conn)
        .await?;
    // Only the first run waits.
    if !waited.swap(true, std::sync::atomic::Ordering::SeqCst) {
        wrote.notify_one();
        go.notified().await;
    }
    drop(conn);
    let mut res = Response::new(Full::new(Bytes::from("created")));
    *res.status_mut() = StatusCode::CREATED;
    Ok(res)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_restarted_mid_request_gives_503_applies_nothing_and_service_comes_back() {
    let own = OwnPostgres::start();
    let pool = crate::pg::pool_in(&own.url(), "public", 4).await;
    sqlx::raw_sql(
        "CREATE TABLE orders (id bigserial PRIMARY KEY, key text NOT NULL, note text NOT NULL)",
    )
    .execute(&pool)
    .await
    .unwrap();
    let store = PostgresStore::from_pool(pool.clone());
    store.migrate().await.unwrap();
    let (wrote, go) = (Arc::new(Notify::new()), Arc::new(Notify::new()));
    let svc = {
        let (wrote, go) = (wrote.clone(), go.clone());
        let waited = Arc::new(std::sync::atomic::AtomicBool::new(false));
        ServiceBuilder::new()
            .layer(IdempotencyLayer::new(store).atomic())
            .service(service_fn(move |req| {
                handler(waited.clone(), wrote.clone(), go.clone(), req)
            }))
    };
    let addr = serve(svc).await;
    let key = fresh("k");

    let first = {
        let key = key.clone();
        tokio::spawn(async move { post(&client(), addr, "/orders", &key, "x").await })
    };
    wrote.notified().await;
    own.down();
    go.notify_one();
    let first = first.await.unwrap().unwrap();
    assert_eq!(first.0, 503, "{first:?}");

    // Down: 503, nothing run.
    let down = post(&client(), addr, "/orders", &fresh("k"), "x")
        .await
        .unwrap();
    assert_eq!(down.0, 503);

    own.up();
    let restarted = Instant::now();
    let mut last = None;
    while restarted.elapsed() < Duration::from_secs(20) {
        match post(&client(), addr, "/orders", &key, "x").await {
            Ok((503, _, _)) => tokio::time::sleep(Duration::from_millis(100)).await,
            answer => {
                last = Some(answer.unwrap());
                break;
            }
        }
    }
    let last = last.expect("the service came back");
    assert_eq!(
        (last.0, last.1),
        (201, false),
        "the same key runs once, cleanly"
    );
    println!("back {:?} after the restart", restarted.elapsed());
    let orders: i64 = sqlx::query_scalar("SELECT count(*) FROM orders WHERE key = $1")
        .bind(&key)
        .fetch_one(&pool)
        .await
        .unwrap();
    assert_eq!(orders, 1, "the write cut by the restart was not applied");
    pool.close().await;
}
