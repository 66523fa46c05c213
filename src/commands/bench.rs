//! `meshca bench issuance`: SVIDs per second beside the raw ring floor, from the same run.

use std::process::ExitCode;
use std::time::{Duration, Instant, SystemTime};

use meshca_ca::{CaParams, CertificateAuthority, SvidRequest};
use meshca_identity::KeyAlgorithm;

use crate::cli::BenchIssuanceArgs;
#[cfg(feature = "drills")]
use crate::cli::{
    BenchAgentsArgs, BenchClient, BenchFederationArgs, BenchSdsArgs, BenchWorkloadArgs,
};
use crate::InvalidInput;

/// Calls `f` repeatedly for `span` on this thread; returns calls per second.
fn rate(span: Duration, mut f: impl FnMut() -> anyhow::Result<()>) -> anyhow::Result<f64> {
    // A short warm-up so neither side pays for first-touch costs.
    for _ in 0..50 {
        f()?;
    }
    let start = Instant::now();
    let mut n = 0u64;
    while start.elapsed() < span {
        for _ in 0..64 {
            f()?;
        }
        n += 64;
    }
    Ok(n as f64 / start.elapsed().as_secs_f64())
}

/// How many calls of one kind run before the next kind's turn in [`interleaved_rates`]: a few
/// milliseconds, so that every kind sees the same moments of the machine.
const BATCH: u64 = 32;

/// Calls each of `kinds` in turns of [`BATCH`] for `span` in all, on this thread; returns each one's
/// calls per second of its own time. Turns alternate every few milliseconds, so a floor and what is
/// compared with it share whatever else the machine did meanwhile (another process, a frequency
/// change): their ratio is a property of the code, not of which second each ran in.
fn interleaved_rates<const N: usize>(
    span: Duration,
    kinds: &mut [&mut dyn FnMut() -> anyhow::Result<()>; N],
) -> anyhow::Result<[f64; N]> {
    for kind in kinds.iter_mut() {
        for _ in 0..50 {
            kind()?;
        }
    }
    let mut spent = [Duration::ZERO; N];
    let mut calls = [0u64; N];
    let start = Instant::now();
    while start.elapsed() < span {
        for (i, kind) in kinds.iter_mut().enumerate() {
            let turn = Instant::now();
            for _ in 0..BATCH {
                kind()?;
            }
            spent[i] += turn.elapsed();
            calls[i] += BATCH;
        }
    }
    Ok(std::array::from_fn(|i| {
        calls[i] as f64 / spent[i].as_secs_f64()
    }))
}

pub fn issuance(args: BenchIssuanceArgs) -> anyhow::Result<ExitCode> {
    if !(args.seconds > 0.0 && args.seconds.is_finite()) {
        return Err(InvalidInput(format!(
            "--seconds must be a positive number, got {}",
            args.seconds
        ))
        .into());
    }
    let span = Duration::from_secs_f64(args.seconds);
    let now = SystemTime::now();
    let ca = CertificateAuthority::generate(
        &CaParams {
            trust_domain: "bench.mesh.local".parse()?,
            key_algorithm: KeyAlgorithm::EcdsaP256,
            validity: Duration::from_secs(365 * 24 * 3600),
            name: "bench".into(),
        },
        now,
    )?;
    let req = SvidRequest {
        spiffe_id: "spiffe://bench.mesh.local/workload/bench".parse()?,
        key_algorithm: KeyAlgorithm::EcdsaP256,
        lifetime: Duration::from_secs(24 * 3600),
    };
    // The floor, the pipeline and the daemon's work, in turns of a few milliseconds (see
    // `interleaved_rates`). The daemon's work per certificate is the pipeline plus the check before
    // publishing (the chain verified once against the CA's anchors, read once) and the key's PEM for
    // SDS.
    let [floor, svid, daemon] = interleaved_rates(
        span * 3,
        &mut [
            &mut || Ok(meshca_ca::floor_once()?),
            &mut || {
                std::hint::black_box(ca.issue(&req, now)?);
                Ok(())
            },
            &mut || {
                let svid = ca.issue(&req, now)?;
                ca.verify_issued(&svid.chain_der, &req.spiffe_id, now)?;
                std::hint::black_box(svid.key.to_pem());
                Ok(())
            },
        ],
    )?;
    let ratio = |x: f64| (x / floor * 1000.0).round() / 1000.0;
    let mut line = serde_json::json!({
        "bench": "issuance",
        "key_algorithm": "ecdsa-p256",
        "seconds": args.seconds,
        "threads": 1,
        "floor_per_sec": floor.round(),
        "svid_per_sec": svid.round(),
        "ratio": ratio(svid),
        "daemon_per_sec": daemon.round(),
        "daemon_ratio": ratio(daemon),
    });
    if args.pkcs11 {
        line["pkcs11"] = token_issuance(&args, span, &ca, &req, now)?;
    }
    if args.rsa_wave > 0 {
        let wave = rsa_wave(&ca, args.rsa_wave, args.keys_ahead, now)?;
        line["rsa_wave"] = serde_json::json!({
            "certificates": args.rsa_wave,
            "keys_ahead": args.keys_ahead.min(args.rsa_wave),
            "keys_generated_per_sec": round2(wave.keys_per_sec),
            "wave_per_sec": round2(wave.wave_per_sec),
            "wave_to_keygen": round3(wave.wave_per_sec / wave.keys_per_sec),
        });
    }
    println!("{line}");
    Ok(ExitCode::SUCCESS)
}

/// Issuance with the CA key in the settings' PKCS#11 token: SVIDs per second on one thread, and on
/// `--threads` threads (each signature in a session of its own) beside the software CA on as many.
fn token_issuance(
    args: &BenchIssuanceArgs,
    span: Duration,
    software: &CertificateAuthority,
    req: &SvidRequest,
    now: SystemTime,
) -> anyhow::Result<serde_json::Value> {
    let settings =
        meshca_config::Settings::load(args.config.config.as_deref(), meshca_daemon::process_env())?;
    let token = meshca_daemon::open_token(&settings)?.ok_or_else(|| {
        InvalidInput(
            "--pkcs11 needs keystore.pkcs11 in the settings: --config FILE, or MESHCA_KEYSTORE_PKCS11_MODULE, \
             MESHCA_KEYSTORE_PKCS11_TOKEN and MESHCA_KEYSTORE_PKCS11_PIN (or _PIN_FILE)"
                .into(),
        )
    })?;
    let threads = args
        .threads
        .unwrap_or_else(|| std::thread::available_parallelism().map_or(1, usize::from))
        .max(1);
    let params = CaParams {
        trust_domain: "bench.mesh.local".parse()?,
        key_algorithm: KeyAlgorithm::EcdsaP256,
        validity: Duration::from_secs(365 * 24 * 3600),
        name: "bench".into(),
    };
    let ca = CertificateAuthority::generate_in_token(&params, now, &token)?;
    let measured = (|| {
        let one = rate(span, || {
            std::hint::black_box(ca.issue(req, now)?);
            Ok(())
        })?;
        let parallel = parallel_rate(&ca, req, now, threads, span)?;
        let software_parallel = parallel_rate(software, req, now, threads, span)?;
        anyhow::Ok((one, parallel, software_parallel))
    })();
    // The bench's key is not left in the token, whatever happened.
    ca.discard()?;
    let (one, parallel, software_parallel) = measured?;
    Ok(serde_json::json!({
        "token": token.label(),
        "svid_per_sec": one.round(),
        "threads": threads,
        "svid_per_sec_parallel": parallel.round(),
        "software_svid_per_sec_parallel": software_parallel.round(),
    }))
}

/// SVIDs per second from `ca` on `threads` threads at once, summed.
fn parallel_rate(
    ca: &CertificateAuthority,
    req: &SvidRequest,
    now: SystemTime,
    threads: usize,
    span: Duration,
) -> anyhow::Result<f64> {
    std::thread::scope(|scope| {
        let workers: Vec<_> = (0..threads)
            .map(|_| {
                scope.spawn(|| {
                    rate(span, || {
                        std::hint::black_box(ca.issue(req, now)?);
                        Ok(())
                    })
                })
            })
            .collect();
        workers
            .into_iter()
            .map(|w| {
                w.join()
                    .map_err(|_| anyhow::anyhow!("a bench thread panicked"))?
            })
            .sum()
    })
}

fn round2(x: f64) -> f64 {
    (x * 100.0).round() / 100.0
}

fn round3(x: f64) -> f64 {
    (x * 1000.0).round() / 1000.0
}

/// What an RSA wave measured.
struct RsaWave {
    /// RSA-2048 keys generated per second on one thread (the keys generated ahead, timed).
    keys_per_sec: f64,
    /// Certificates per second for the wave (issue, check, PEM), starting with the keys ahead.
    wave_per_sec: f64,
}

/// Generates `ahead` RSA-2048 keys (timed: the key generation rate), then issues `count` RSA-2048 SVIDs
/// as the daemon does, taking a key generated ahead while any is left and generating the rest (timed:
/// the wave's rate).
fn rsa_wave(
    ca: &CertificateAuthority,
    count: usize,
    ahead: usize,
    now: SystemTime,
) -> anyhow::Result<RsaWave> {
    let ahead = ahead.min(count);
    let started = Instant::now();
    let mut keys = (0..ahead.max(1))
        .map(|_| meshca_ca::GeneratedKey::new(KeyAlgorithm::Rsa2048))
        .collect::<Result<Vec<_>, _>>()?;
    let keys_per_sec = keys.len() as f64 / started.elapsed().as_secs_f64();
    keys.truncate(ahead);
    let req = SvidRequest {
        spiffe_id: "spiffe://bench.mesh.local/workload/bench".parse()?,
        key_algorithm: KeyAlgorithm::Rsa2048,
        lifetime: Duration::from_secs(24 * 3600),
    };
    let started = Instant::now();
    for _ in 0..count {
        let svid = ca.issue_with_key(&req, keys.pop(), now)?;
        ca.verify_issued(&svid.chain_der, &req.spiffe_id, now)?;
        std::hint::black_box(svid.key.to_pem());
    }
    Ok(RsaWave {
        keys_per_sec,
        wave_per_sec: count as f64 / started.elapsed().as_secs_f64(),
    })
}

/// The library's name for where a bench runs its clients.
#[cfg(feature = "drills")]
fn bench_client(client: BenchClient) -> meshca_drill::bench::harness::BenchClient {
    use meshca_drill::bench::harness::BenchClient as Library;
    match client {
        BenchClient::Process => Library::Process,
        BenchClient::InProcess => Library::InProcess,
    }
}

/// `meshca bench workload`: the library's bench with the command line's options.
#[cfg(feature = "drills")]
pub async fn workload(args: BenchWorkloadArgs) -> anyhow::Result<ExitCode> {
    use meshca_drill::bench::workload;
    workload::run(workload::WorkloadArgs {
        streams: args.streams,
        connections: args.connections,
        ack_after: args.ack_after,
        registrations: args.registrations,
        agent: args.agent,
        seconds: args.run.seconds,
        timeout: args.run.timeout,
        client: bench_client(args.run.client),
    })
    .await
}

/// `meshca bench federation`: the library's bench with the command line's options.
#[cfg(feature = "drills")]
pub async fn federation(args: BenchFederationArgs) -> anyhow::Result<ExitCode> {
    use meshca_drill::bench::federation;
    federation::run(federation::FederationArgs {
        relationships: args.relationships,
        refresh: args.refresh,
        seconds: args.seconds,
        streams: args.streams,
        timeout: args.timeout,
    })
    .await
}

/// `meshca bench agents`: the library's bench with the command line's options.
#[cfg(feature = "drills")]
pub async fn agents(args: BenchAgentsArgs) -> anyhow::Result<ExitCode> {
    use meshca_drill::bench::agents;
    agents::run(agents::AgentsArgs {
        agents: args.agents,
        registrations: args.registrations,
        seconds: args.run.seconds,
        timeout: args.run.timeout,
        client: bench_client(args.run.client),
    })
    .await
}

/// `meshca bench sds`: the library's bench with the command line's options.
#[cfg(feature = "drills")]
pub async fn sds(args: BenchSdsArgs) -> anyhow::Result<ExitCode> {
    use meshca_drill::bench::sds;
    sds::run(sds::SdsArgs {
        streams: args.streams,
        connections: args.connections,
        proxies: args.proxies,
        identity_every: args.identity_every,
        node_extensions: args.node_extensions,
        console_clients: args.console_clients,
        seconds: args.run.seconds,
        timeout: args.run.timeout,
        client: bench_client(args.run.client),
    })
    .await
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every kind runs in the same turns, as often as the others; a failing kind fails the bench.
    #[test]
    fn interleaved_kinds_run_equally_often_and_a_failure_stops_them() {
        let (mut a, mut b) = (0u64, 0u64);
        let rates = interleaved_rates(
            Duration::from_millis(5),
            &mut [
                &mut || {
                    a += 1;
                    Ok(())
                },
                &mut || {
                    b += 1;
                    Ok(())
                },
            ],
        )
        .expect("nothing fails");
        assert!(rates.iter().all(|r| *r > 0.0), "{rates:?}");
        assert_eq!(a, b);
        assert_eq!((a - 50) % BATCH, 0, "whole turns after the warm-up");
        assert!(a > 50, "at least one turn");

        let mut calls = 0;
        let failed = interleaved_rates(
            Duration::from_secs(60),
            &mut [&mut || {
                calls += 1;
                if calls > 60 {
                    anyhow::bail!("the floor failed");
                }
                Ok(())
            }],
        );
        assert!(failed.is_err_and(|e| e.to_string() == "the floor failed"));
    }
}
