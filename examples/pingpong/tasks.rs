//! `--async`: a side's requests awaited as futures in one task of a tokio runtime (current
//! thread), its worker driven by `rdmx::tokio::drive` — the path of an async service.

#[cfg(feature = "tokio")]
use std::collections::VecDeque;

use rdmx::Worker;
#[cfg(feature = "tokio")]
use rdmx::{Ep, Request, TAG_MASK_ALL};
#[cfg(feature = "tokio")]
use rdmx_bench::schema::{histogram, record, Histogram, PingpongRow};

use super::Result;
#[cfg(feature = "tokio")]
use super::{alloc, check_len, failed, latency_row, pattern, Run, Source, ACK, DATA};

/// Where a side's requests are awaited as futures (`--async`): a runtime of one thread and
/// the worker's driver on it.
pub(super) struct Tasks {
    #[cfg(feature = "tokio")]
    pub(super) rt: tokio::runtime::Runtime,
    #[cfg(feature = "tokio")]
    _driver: rdmx::tokio::Driver,
}

impl Tasks {
    /// With `--async`, a runtime driving `worker`.
    #[cfg(feature = "tokio")]
    pub(super) fn new(on: bool, worker: &Worker) -> Result<Option<Tasks>> {
        if !on {
            return Ok(None);
        }
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(|e| format!("a tokio runtime: {e}"))?;
        let driver = {
            let _in = rt.enter();
            rdmx::tokio::drive(worker).map_err(|e| e.to_string())?
        };
        Ok(Some(Tasks {
            rt,
            _driver: driver,
        }))
    }

    #[cfg(not(feature = "tokio"))]
    pub(super) fn new(on: bool, _worker: &Worker) -> Result<Option<Tasks>> {
        match on {
            true => Err("--async needs rdmx's tokio feature (on by default)".into()),
            false => Ok(None),
        }
    }
}

/// [`serve_latency`] awaiting its requests (`--async`).
#[cfg(feature = "tokio")]
pub(super) async fn serve_latency_async(
    worker: &Worker,
    ep: &Ep,
    size: u64,
    total: u64,
) -> Result<()> {
    let mut buf = alloc(size)?;
    for _ in 0..total {
        let got = worker
            .tag_recv(DATA, TAG_MASK_ALL, buf)
            .await
            .map_err(|e| failed("receive", e))?;
        check_len(&got, size)?;
        buf = ep
            .tag_send(DATA, got.buf)
            .await
            .map_err(|e| failed("send", e))?
            .buf;
    }
    Ok(())
}

/// [`latency`] awaiting its requests (`--async`).
#[cfg(feature = "tokio")]
pub(super) async fn latency_async(
    &Run {
        worker, ep, clock, ..
    }: &Run<'_>,
    size: u64,
    protocol: &str,
    (warm, timed): (u64, u64),
    run_clock: bool,
) -> Result<PingpongRow> {
    let total = warm + timed;
    let mut sbuf = pattern(size, total)?;
    let mut rbuf = alloc(size)?;
    let mut rtt = histogram();
    let mut t0 = clock.now();
    for i in 0..total {
        if run_clock && i == warm {
            t0 = clock.now();
        }
        sbuf = ep
            .tag_send(DATA, sbuf)
            .await
            .map_err(|e| failed("send", e))?
            .buf;
        let got = worker
            .tag_recv(DATA, TAG_MASK_ALL, rbuf)
            .await
            .map_err(|e| failed("receive", e))?;
        if !run_clock {
            let t1 = clock.now();
            if i >= warm {
                record(&mut rtt, clock.between(t0, t1));
            }
            t0 = t1;
        }
        check_len(&got, size)?;
        rbuf = got.buf;
    }
    latency_row(
        size,
        protocol,
        (warm, timed),
        run_clock,
        (sbuf, rbuf),
        rtt,
        clock,
        t0,
    )
}

/// [`super::send_window`] awaiting its requests (`--async`): the oldest send of the window
/// is awaited before the next starts.
#[cfg(feature = "tokio")]
pub(super) async fn send_window_async(
    &Run {
        worker, ep, clock, ..
    }: &Run<'_>,
    src: &mut Source,
    window: usize,
    count: u64,
    mut gaps: Option<&mut Histogram<u64>>,
) -> Result<()> {
    let ack = worker.tag_recv(ACK, TAG_MASK_ALL, Vec::new());
    let mut sends: VecDeque<Request> = VecDeque::with_capacity(window);
    let mut last = clock.now();
    for _ in 0..count {
        if sends.len() == window {
            let oldest = sends.pop_front().ok_or("an empty send window")?;
            let buf = oldest.await.map_err(|e| failed("send", e))?.buf;
            if let Source::Own(bufs) = src {
                bufs.push(buf);
            }
            if let Some(gaps) = gaps.as_deref_mut() {
                let now = clock.now();
                record(gaps, clock.between(last, now));
                last = now;
            }
        }
        sends.push_back(match src {
            Source::Shared(data) => ep.tag_send_shared(DATA, data),
            Source::Own(bufs) => ep.tag_send(DATA, bufs.pop().ok_or("no send buffer left")?),
        });
    }
    for s in sends {
        let buf = s.await.map_err(|e| failed("send", e))?.buf;
        if let Source::Own(bufs) = src {
            bufs.push(buf);
        }
    }
    ack.await.map_err(|e| failed("acknowledgement", e))?;
    Ok(())
}

/// [`super::serve_window`] awaiting its requests (`--async`).
#[cfg(feature = "tokio")]
pub(super) async fn serve_window_async(
    worker: &Worker,
    ep: &Ep,
    bufs: &mut Vec<Vec<u8>>,
    size: u64,
    count: u64,
) -> Result<()> {
    let mut posted: VecDeque<Request> = bufs
        .drain(..)
        .take(count as usize)
        .map(|b| worker.tag_recv(DATA, TAG_MASK_ALL, b))
        .collect();
    let mut started = posted.len() as u64;
    while let Some(r) = posted.pop_front() {
        let got = r.await.map_err(|e| failed("receive", e))?;
        check_len(&got, size)?;
        if started < count {
            posted.push_back(worker.tag_recv(DATA, TAG_MASK_ALL, got.buf));
            started += 1;
        } else {
            bufs.push(got.buf);
        }
    }
    ep.tag_send(ACK, Vec::new())
        .await
        .map_err(|e| failed("acknowledgement", e))?;
    Ok(())
}
