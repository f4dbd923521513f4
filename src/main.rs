//! The `tensorgate` command: `serve`, `worker` and `check-config`.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};
use tensorgate::config::{Config, LogFormat, MAX_WORKER_THREADS};
use tensorgate::models::DEFAULT_SEQUENCE_IDLE_TIMEOUT_MS;
use tensorgate::reload::Loader;

#[derive(Parser)]
#[command(
    name = "tensorgate",
    version,
    about = "A gateway for fleets of Open Inference Protocol (KServe v2 / Triton HTTP and gRPC) model servers",
    long_about = "tensorgate terminates v2 REST and gRPC requests, validates them against each model's metadata, \
transcodes between JSON and binary tensors, pins sequences to backends, and forwards to a fleet of \
Triton, MLServer, KServe or built-in workers."
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

/// A listen address, or none (`""`).
#[derive(Clone, Debug)]
struct OptionalAddress(Option<SocketAddr>);

fn optional_address(text: &str) -> Result<OptionalAddress, String> {
    tensorgate::config::parse_optional_address(text).map(OptionalAddress)
}

#[derive(Subcommand)]
enum Command {
    /// Run the gateway. With neither --config nor --backend, it serves every built-in model
    /// in-process: the v2 REST API on 0.0.0.0:8000, the v2 gRPC API on 0.0.0.0:8001 and
    /// metrics on 0.0.0.0:8002 (the embedded default config).
    Serve {
        /// TOML config file (see config/tensorgate.toml for every key).
        #[arg(long, value_name = "FILE")]
        config: Option<PathBuf>,
        /// Address of the v2 REST listener, overriding server.listen.
        #[arg(long, value_name = "ADDR")]
        listen: Option<SocketAddr>,
        /// Address of the Prometheus /metrics listener, overriding server.metrics_listen
        /// (default 0.0.0.0:8002, Triton's metrics port); "" turns it off. Bind it to
        /// 127.0.0.1 to keep it private.
        #[arg(long, value_name = "ADDR", value_parser = optional_address)]
        metrics_listen: Option<OptionalAddress>,
        /// Address of the v2 gRPC listener (inference.GRPCInferenceService and
        /// grpc.health.v1.Health), overriding server.grpc_listen (default 0.0.0.0:8001,
        /// Triton's gRPC port); "" turns it off.
        #[arg(long, value_name = "ADDR", value_parser = optional_address)]
        grpc_listen: Option<OptionalAddress>,
        /// A backend: http://host:port of any v2 server, or `builtin` for the in-process
        /// models. Repeatable; replaces the config's backends.
        #[arg(long = "backend", value_name = "URL")]
        backends: Vec<String>,
        /// A Triton-style model repository (DIR/<model>/<version>/model.onnx, optional
        /// DIR/<model>/config.pbtxt) whose ONNX models the built-in backend serves in-process,
        /// beside the built-in models. Sets model_repository of the config's builtin backend.
        #[arg(long, value_name = "DIR")]
        model_repository: Option<PathBuf>,
        /// Threads that serve requests, overriding server.worker_threads (0: the
        /// TOKIO_WORKER_THREADS variable, else one per core). 1 runs a single-threaded
        /// runtime, the cheapest per request on one core (with [fleet.pins] store = "redis"
        /// and many new sequences it serves fewer requests: leave it unset there).
        #[arg(long, value_name = "N", value_parser = worker_threads)]
        worker_threads: Option<usize>,
    },
    /// Run a standalone v2 REST server of the built-in models and, with --model-repository,
    /// of the ONNX models of a Triton-style model repository. A local fleet is several
    /// workers behind one `serve`.
    Worker {
        /// Address to listen on.
        #[arg(long, value_name = "ADDR", default_value = "0.0.0.0:9000")]
        listen: SocketAddr,
        /// Comma-separated models to serve (default: every built-in model, and every model of
        /// --model-repository). With a repository the list may name its models too: a list
        /// that names any of them loads and serves only the models it names (a load of
        /// another is refused), so a list of repository models alone turns the built-in demo
        /// models off.
        #[arg(long, value_name = "NAME,...", value_delimiter = ',')]
        models: Vec<String>,
        /// How long the `accumulate` model keeps a sequence's running sum without a request
        /// for it, in milliseconds. After that the sequence is forgotten: its next request
        /// must set sequence_start again, or it is refused with 400.
        #[arg(
            long,
            value_name = "MS",
            env = "TENSORGATE_SEQUENCE_IDLE_TIMEOUT_MS",
            default_value_t = DEFAULT_SEQUENCE_IDLE_TIMEOUT_MS,
            value_parser = clap::value_parser!(u64).range(1..)
        )]
        sequence_idle_timeout_ms: u64,
        /// A Triton-style model repository (DIR/<model>/<version>/model.onnx, optional
        /// DIR/<model>/config.pbtxt) to serve beside the built-in models, run by tract on a
        /// blocking pool. A model that fails to load is UNAVAILABLE in the repository index,
        /// with its reason; the others serve. POST /v2/repository/models/NAME/load reads a
        /// model again, /unload unloads it.
        #[arg(long, value_name = "DIR")]
        model_repository: Option<PathBuf>,
        /// Threads that serve requests (0: the TOKIO_WORKER_THREADS variable, else one per
        /// core). 1 runs a single-threaded runtime; ONNX models still run on their own
        /// blocking pool, sized by each model's instance_group count.
        #[arg(long, value_name = "N", default_value_t = 0, value_parser = worker_threads)]
        worker_threads: usize,
        /// Address of a Prometheus /metrics listener for this worker's models (the
        /// nv_inference_* series, as Triton's port 8002 has them); off by default, so that
        /// several workers on one host need no ports but their own. The log level is
        /// RUST_LOG's (default info).
        #[arg(long, value_name = "ADDR", value_parser = optional_address)]
        metrics_listen: Option<OptionalAddress>,
    },
    /// Check a config file and print each error with its line number, then check that
    /// every file it names (certificates, keys, tokens, labels) can be read from the
    /// current directory, as `serve` would read them.
    CheckConfig {
        /// The TOML config file to check (config/tensorgate.toml documents every key).
        #[arg(value_name = "FILE")]
        file: PathBuf,
    },
}

/// Log lines are written in batches by a thread of their own (`tensorgate::logwriter`), so
/// that no request waits on a `write` to stderr; the guard writes what is left when `main`
/// returns.
fn init_logging(level: &str, format: LogFormat) -> tensorgate::logwriter::FlushGuard {
    // RUST_LOG wins when it is a filter that logs something. An empty one (a Helm leftover)
    // or a misspelt level ("verbose", which tracing reads as a target and then logs nothing
    // else) would silence even the error a failed start prints: server.log_level then
    // applies, and the first line says why.
    let from_env = std::env::var("RUST_LOG").ok();
    let (filter, refused) = match from_env.as_deref() {
        None => (level.to_string(), None),
        Some(env) => match tensorgate::config::check_log_filter(env) {
            Ok(()) => (env.to_string(), None),
            Err(why) => (level.to_string(), Some((env.to_string(), why))),
        },
    };
    let filter = tracing_subscriber::EnvFilter::new(filter);
    let (writer, guard) = tensorgate::logwriter::batched_stderr();
    let ansi = std::io::IsTerminal::is_terminal(&std::io::stderr());
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(ansi)
        .with_writer(writer.clone());
    match format {
        LogFormat::Plain => {
            if !ansi {
                tensorgate::logformat::direct_access_lines(writer.clone());
            }
            builder
                .event_format(tensorgate::logformat::PlainFormat::default())
                .init()
        }
        LogFormat::Json => builder.json().init(),
    }
    if let Some((env, why)) = refused {
        tracing::warn!(rust_log = %env, level = %level, "RUST_LOG is not a log filter: {why}; logging at {level} instead (server.log_level for serve)");
    }
    // A panic (our bug, or tract's on some inputs, caught and answered 500) is a log line
    // like any other, not text on stderr between the batched lines (and a JSON log's
    // parser), written at once (an abort may follow). Its backtrace comes with it when
    // RUST_BACKTRACE (or RUST_LIB_BACKTRACE) asks for one.
    let flush = writer.clone();
    std::panic::set_hook(Box::new(move |info| {
        let message = tensorgate::error::panic_message(info.payload());
        let location = info.location().map(ToString::to_string).unwrap_or_default();
        let backtrace = std::backtrace::Backtrace::capture();
        if backtrace.status() == std::backtrace::BacktraceStatus::Captured {
            tracing::error!(panic = message, %location, %backtrace, "panicked");
        } else {
            tracing::error!(panic = message, %location, "panicked");
        }
        flush.flush_now();
    }));
    guard
}

/// One thread (from the config, or `TOKIO_WORKER_THREADS=1`) gets tokio's current-thread
/// scheduler: a multi-threaded runtime with one worker still pays for cross-thread wake-ups
/// and its injection queue on every task switch (about 1.5 us of CPU per proxied request).
fn build_runtime(configured: usize) -> std::io::Result<tokio::runtime::Runtime> {
    let threads = match configured {
        0 => std::env::var("TOKIO_WORKER_THREADS")
            .ok()
            .and_then(|v| v.trim().parse::<usize>().ok())
            .unwrap_or(0),
        n => n,
    };
    if threads > MAX_WORKER_THREADS {
        return Err(std::io::Error::other(format!(
            "TOKIO_WORKER_THREADS must be at most {MAX_WORKER_THREADS}, not {threads}"
        )));
    }
    let mut builder = if threads == 1 {
        tokio::runtime::Builder::new_current_thread()
    } else {
        let mut b = tokio::runtime::Builder::new_multi_thread();
        if threads > 1 {
            b.worker_threads(threads);
        }
        b
    };
    builder.enable_all().build()
}

/// What `serve`'s flags set over the config file, applied at start and at every reload.
struct Overrides {
    backends: Vec<String>,
    model_repository: Option<PathBuf>,
    listen: Option<SocketAddr>,
    metrics_listen: Option<Option<SocketAddr>>,
    grpc_listen: Option<Option<SocketAddr>>,
    worker_threads: Option<usize>,
}

impl Overrides {
    fn apply(&self, c: &mut Config) -> Result<(), Vec<String>> {
        if !self.backends.is_empty() {
            c.set_backends(&self.backends).map_err(|errors| {
                errors
                    .into_iter()
                    .map(|e| format!("--backend: {}", e.message))
                    .collect::<Vec<_>>()
            })?;
        }
        if let Some(dir) = &self.model_repository {
            c.set_model_repository(dir).map_err(|e| vec![e])?;
        }
        if let Some(l) = self.listen {
            c.server.listen = l;
        }
        if let Some(l) = self.metrics_listen {
            c.server.metrics_listen = l;
        }
        if let Some(l) = self.grpc_listen {
            c.server.grpc_listen = l;
        }
        if let Some(n) = self.worker_threads {
            c.server.worker_threads = n;
        }
        Ok(())
    }
}

/// `--worker-threads`: the config key's bound, checked where the flag is read.
fn worker_threads(text: &str) -> Result<usize, String> {
    let n: usize = text
        .trim()
        .parse()
        .map_err(|_| format!("'{text}' is not a number of threads"))?;
    if n > MAX_WORKER_THREADS {
        return Err(format!(
            "must be at most {MAX_WORKER_THREADS} (0 picks one per core), not {n}"
        ));
    }
    Ok(n)
}

fn print_errors(file: &std::path::Path, errors: &[tensorgate::config::ConfigError]) {
    for e in errors {
        eprintln!("{}", located(file, e));
    }
}

/// `file:line: message`, as compilers write it (and editors jump to it); a reload's log
/// line says it the same way as `check-config`.
fn located(file: &std::path::Path, e: &tensorgate::config::ConfigError) -> String {
    match e.line {
        Some(l) => format!("{}:{l}: {}", file.display(), e.message),
        None => format!("{}: {}", file.display(), e.message),
    }
}

async fn run(
    config: Config,
    with_metrics: bool,
    reload: Option<(Loader, Option<PathBuf>)>,
) -> ExitCode {
    // Listening for SIGHUP from the start replaces its default action (exit), so a reload
    // signal that arrives during the first discovery round cannot kill the process.
    let _early_hup = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::hangup()).ok();
    let running = match tensorgate::run::start(config, with_metrics).await {
        Ok(r) => r,
        Err(e) => {
            tracing::error!("{e}");
            return ExitCode::FAILURE;
        }
    };
    let off =
        |a: Option<std::net::SocketAddr>| a.map_or_else(|| "off".to_string(), |a| a.to_string());
    let backends = running.gateway.config().backends.len();
    tracing::info!(
        rest = %running.addr,
        grpc = %off(running.grpc_addr),
        metrics = %off(running.metrics_addr),
        backends,
        "tensorgate is serving"
    );
    if backends == 0 {
        tracing::warn!(
            "no [[backends]] are configured: every model is unknown until a reload adds some"
        );
    }
    let reloader = reload.map(|(load, watch)| {
        tokio::spawn(tensorgate::reload::run(
            running.gateway.clone(),
            load,
            watch,
            running.tls.clone(),
        ))
    });
    wait_for_signal().await;
    if let Some(r) = reloader {
        r.abort();
    }
    tracing::info!("shutting down: draining in-flight requests");
    running.shutdown().await;
    ExitCode::SUCCESS
}

async fn wait_for_signal() {
    use tokio::signal::unix::{signal, SignalKind};
    let mut term = signal(SignalKind::terminate()).expect("SIGTERM handler");
    tokio::select! {
        _ = term.recv() => {}
        _ = tokio::signal::ctrl_c() => {}
    }
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let (config, with_metrics, reload) = match cli.command {
        Command::CheckConfig { file } => {
            return match Config::load_with_text(&file) {
                Ok((config, text)) => {
                    let unreadable = tensorgate::config::unreadable_files(&config, &text);
                    if !unreadable.is_empty() {
                        print_errors(&file, &unreadable);
                        return ExitCode::FAILURE;
                    }
                    // What serve checks once the files are read: the TLS files as serve
                    // builds them (a key that does not match its certificate, or a CA file
                    // without a certificate, reads fine as a file), and a built-in backend's
                    // model names against its repository.
                    use tensorgate::config::{error_at_key, error_at_path};
                    let mut late = Vec::new();
                    if let Some(t) = &config.server.tls {
                        if let Err(e) = tensorgate::tls::server_config(t) {
                            late.push(error_at_key(
                                &text,
                                tensorgate::tls::in_table("server.tls", &e),
                            ));
                        }
                    }
                    if let Err(e) = tensorgate::tls::client_config(&config.fleet.tls) {
                        late.push(error_at_key(
                            &text,
                            tensorgate::tls::in_table("fleet.tls", &e),
                        ));
                    }
                    for (i, b) in config.backends.iter().enumerate() {
                        if b.url.get_ref() != "builtin" {
                            continue;
                        }
                        let repository = b.model_repository.as_deref().filter(|d| d.is_dir());
                        if let Err(e) = tensorgate::models::check_model_names(&b.models, repository)
                        {
                            let message = format!("backend '{}': {e}", b.name.get_ref());
                            late.push(error_at_path(
                                &text,
                                &format!("backends.{i}.models"),
                                message,
                            ));
                        }
                    }
                    if !late.is_empty() {
                        print_errors(&file, &late);
                        return ExitCode::FAILURE;
                    }
                    if config.backends.is_empty() {
                        // Valid (a reload may add them), but a gateway that serves nothing.
                        println!(
                            "{}: ok, but no [[backends]] are configured: such a gateway knows no model",
                            file.display()
                        );
                    } else {
                        println!("{}: ok", file.display());
                    }
                    ExitCode::SUCCESS
                }
                Err(errors) => {
                    print_errors(&file, &errors);
                    ExitCode::FAILURE
                }
            };
        }
        Command::Serve {
            config,
            listen,
            metrics_listen,
            grpc_listen,
            backends,
            model_repository,
            worker_threads,
        } => {
            let mut c = match &config {
                Some(path) => match Config::load(path) {
                    Ok(c) => c,
                    Err(errors) => {
                        print_errors(path, &errors);
                        return ExitCode::FAILURE;
                    }
                },
                None => Config::embedded_default(),
            };
            let overrides = Overrides {
                backends,
                model_repository,
                listen,
                metrics_listen: metrics_listen.map(|OptionalAddress(a)| a),
                grpc_listen: grpc_listen.map(|OptionalAddress(a)| a),
                worker_threads,
            };
            if let Err(errors) = overrides.apply(&mut c) {
                for e in errors {
                    eprintln!("{e}");
                }
                return ExitCode::FAILURE;
            }
            // A reload reads the file again and re-applies the whole command line over it,
            // so that what it compares with the running config is what the user changed.
            let watch = config.clone().filter(|_| c.fleet.watch_config);
            let loader: Loader = std::sync::Arc::new(move || {
                let mut c = match &config {
                    Some(path) => Config::load(path).map_err(|errors| {
                        errors
                            .iter()
                            .map(|e| located(path, e))
                            .collect::<Vec<_>>()
                            .join("; ")
                    })?,
                    None => Config::embedded_default(),
                };
                overrides.apply(&mut c).map_err(|e| e.join("; "))?;
                Ok(c)
            });
            (c, true, Some((loader, watch)))
        }
        Command::Worker {
            listen,
            models,
            sequence_idle_timeout_ms,
            model_repository,
            worker_threads,
            metrics_listen,
        } => {
            if let Some(dir) = model_repository.as_deref().filter(|d| !d.is_dir()) {
                eprintln!("--model-repository {}: not a directory", dir.display());
                return ExitCode::FAILURE;
            }
            if let Err(e) =
                tensorgate::models::check_model_names(&models, model_repository.as_deref())
            {
                eprintln!("--models: {e}");
                return ExitCode::FAILURE;
            }
            let mut c = Config::worker(listen, &models);
            c.server.worker_threads = worker_threads;
            c.server.metrics_listen = metrics_listen.and_then(|OptionalAddress(a)| a);
            let with_metrics = c.server.metrics_listen.is_some();
            c.set_sequence_idle_timeout(std::time::Duration::from_millis(sequence_idle_timeout_ms));
            if let Some(dir) = &model_repository {
                c.set_model_repository(dir)
                    .expect("a worker's config has the built-in backend");
            }
            (c, with_metrics, None)
        }
    };
    tensorgate::run::prepare_process(&config);
    let _log_writer = init_logging(&config.server.log_level, config.server.log_format);
    let runtime = match build_runtime(config.server.worker_threads) {
        Ok(r) => r,
        Err(e) => {
            eprintln!("cannot start the async runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    runtime.block_on(run(config, with_metrics, reload))
}
