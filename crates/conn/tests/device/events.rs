//! Event-driven waiting: a waiter sleeps, wakes for every completion and rdmacm event, and loses none.

use super::*;

#[test]
#[ignore = "needs an RDMA device: scripts/test runs it in the Soft-RoCE guest"]
fn event_driven_wait_sleeps_and_loses_no_wakeup() {
    const MESSAGES: usize = 200;
    let Pair {
        server,
        client,
        client_conn: conn,
        server_conn: _server_conn,
        ..
    } = connected_pair(addr_a(), 64, true, false);

    let (tid_tx, tid_rx) = mpsc::channel();
    let cq = server.cq.clone();
    let srq = server.srq.clone().unwrap();
    let waiter = thread::spawn(move || {
        tid_tx.send(gettid()).unwrap();
        let mut got = Vec::new();
        let mut received = 0;
        while received < MESSAGES {
            let mut batch = Vec::new();
            let n = cq.wait(&mut batch, 16, Some(LONG)).unwrap();
            assert!(
                n > 0,
                "woke with nothing after {received} messages: a wakeup was lost"
            );
            for c in batch {
                assert!(c.status.is_success());
                got.push(c.buffer.as_ref().unwrap()[0]);
                srq.post_recv(c.buffer.unwrap(), 0)
                    .map_err(|(e, _)| e)
                    .unwrap();
                received += 1;
            }
        }
        got
    });
    let tid = tid_rx.recv().unwrap();

    // While nothing arrives, the waiter sleeps in the kernel and burns no CPU.
    let deadline = Instant::now() + LONG;
    while thread_stat(tid).0 != 'S' {
        assert!(Instant::now() < deadline, "the waiter never went to sleep");
        thread::sleep(Duration::from_millis(5));
    }
    let (_, ticks_before) = thread_stat(tid);
    thread::sleep(Duration::from_millis(500));
    let (state, ticks_after) = thread_stat(tid);
    println!(
        "event-mode waiter: {} CPU ticks (of {} per second) while asleep for 0.5 s",
        ticks_after - ticks_before,
        ticks_per_second()
    );
    assert_eq!(state, 'S', "the waiter is still asleep");
    assert!(
        ticks_after - ticks_before <= 2,
        "a sleeping waiter used {} CPU ticks in 0.5 s",
        ticks_after - ticks_before
    );

    // Messages at irregular moments, some back to back: every one wakes or is found by the waiter.
    for i in 0..MESSAGES {
        conn.post_send_inline(&[i as u8], i as u64).unwrap();
        if i % 7 == 0 {
            thread::sleep(Duration::from_millis((i % 5) as u64));
        }
        if i % 32 == 31 {
            collect(&client.cq, 32);
        }
    }
    let got = waiter.join().unwrap();
    assert_eq!(
        got,
        (0..MESSAGES).map(|i| i as u8).collect::<Vec<_>>(),
        "all messages, in order"
    );
}

#[test]
#[ignore = "needs an RDMA device: scripts/test runs it in the Soft-RoCE guest"]
fn take_events_drains_the_channel_a_poller_woke_on() {
    let Pair {
        server,
        client,
        server_conn: _server_conn,
        client_conn: conn,
        ..
    } = connected_pair(addr_a(), 8, false, true);
    assert_eq!(server.cq.take_events().unwrap(), 0, "no channel, no events");
    assert_eq!(client.cq.take_events().unwrap(), 0, "nothing happened yet");

    const CQ: u64 = 1;
    const WAKER: u64 = 2;
    let poller = Poller::new().unwrap();
    let waker = Waker::new().unwrap();
    poller
        .add(client.cq.event_fd().expect("an events CQ").as_raw_fd(), CQ)
        .unwrap();
    poller.add(waker.fd(), WAKER).unwrap();
    let mut ready = Vec::new();
    assert_eq!(
        poller
            .wait(&mut ready, Some(Duration::from_millis(50)))
            .unwrap(),
        0
    );

    client.cq.request_notify().unwrap();
    conn.post_send_inline(b"ping", 5).unwrap();
    let deadline = Instant::now() + LONG;
    while !ready.contains(&CQ) {
        let remaining = deadline
            .checked_duration_since(Instant::now())
            .expect("the send's completion never made the channel readable");
        poller.wait(&mut ready, Some(remaining)).unwrap();
    }
    assert!(!ready.contains(&WAKER), "{ready:?}");
    let taken = client.cq.take_events().unwrap();
    assert!(
        taken >= 1,
        "the channel was readable but {taken} events taken"
    );
    assert_eq!(client.cq.take_events().unwrap(), 0, "all were taken");

    // The channel is quiet again; the completion itself is still in the CQ.
    ready.clear();
    assert_eq!(
        poller
            .wait(&mut ready, Some(Duration::from_millis(50)))
            .unwrap(),
        0,
        "{ready:?}"
    );
    let sent = collect(&client.cq, 1);
    assert_eq!(sent[0].cookie, 5);
    assert!(sent[0].status.is_success(), "{sent:?}");
    collect(&server.cq, 1);

    // The waker shares the poller without disturbing the CQ's registration.
    waker.wake();
    assert_eq!(poller.wait(&mut ready, Some(LONG)).unwrap(), 1);
    assert_eq!(ready, [WAKER]);
    waker.drain();
    poller
        .remove(client.cq.event_fd().unwrap().as_raw_fd())
        .unwrap();
}

/// Scheduler state ('R', 'S', …) and user+system CPU ticks of one thread of this process.
fn thread_stat(tid: i32) -> (char, u64) {
    let stat = std::fs::read_to_string(format!("/proc/self/task/{tid}/stat")).unwrap();
    let after = &stat[stat.rfind(')').unwrap() + 2..];
    let fields: Vec<&str> = after.split_whitespace().collect();
    // After "pid (comm) ": state is field 3 of the line, utime 14, stime 15.
    let state = fields[0].chars().next().unwrap();
    let ticks = fields[11].parse::<u64>().unwrap() + fields[12].parse::<u64>().unwrap();
    (state, ticks)
}

fn ticks_per_second() -> u64 {
    // The kernel's USER_HZ, as getconf reports it; 100 on Linux/x86-64.
    std::process::Command::new("getconf")
        .arg("CLK_TCK")
        .output()
        .ok()
        .and_then(|o| String::from_utf8(o.stdout).ok())
        .and_then(|s| s.trim().parse().ok())
        .unwrap_or(100)
}

fn gettid() -> i32 {
    std::fs::read_link("/proc/thread-self")
        .unwrap()
        .file_name()
        .unwrap()
        .to_str()
        .unwrap()
        .parse()
        .unwrap()
}
