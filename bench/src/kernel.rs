//! Kernel baselines for the perftest report: UDP ping-pong latency, TCP stream bandwidth and
//! UDP datagram rate, between this process and a `perf_report serve` child (on loopback, or in
//! a network namespace across a veth). The child prints one JSON line per finished TCP or UDP
//! stream, which the client reads back.

use serde_json::Value;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream, UdpSocket};
use std::process::{Child, ChildStdout, Command, Stdio};
use std::time::{Duration, Instant};

/// UDP echo port of the server.
pub const ECHO: u16 = 19000;
/// TCP sink port.
pub const TCP_SINK: u16 = 19001;
/// UDP sink port.
pub const UDP_SINK: u16 = 19002;
/// The datagram that ends a UDP stream.
const END: &[u8] = b"ferroce-bench-end";

/// Serves the three endpoints on `ip` until killed (the child side).
pub fn serve(ip: &str) -> std::io::Result<()> {
    let echo = UdpSocket::bind((ip, ECHO))?;
    std::thread::spawn(move || {
        let mut b = [0u8; 65536];
        while let Ok((n, from)) = echo.recv_from(&mut b) {
            let _ = echo.send_to(&b[..n], from);
        }
    });
    let sink = UdpSocket::bind((ip, UDP_SINK))?;
    let _ = set_rcvbuf(&sink, 8 << 20);
    std::thread::spawn(move || {
        let mut b = [0u8; 65536];
        let (mut n, mut first) = (0u64, None::<Instant>);
        while let Ok(len) = sink.recv(&mut b) {
            if &b[..len] == END {
                // END is sent a few times; the first one after a stream reports it.
                if n > 0 {
                    let secs = first.map_or(0.0, |t| t.elapsed().as_secs_f64());
                    println!("{{\"udp_msgs\": {n}, \"secs\": {secs}}}");
                    let _ = std::io::stdout().flush();
                }
                n = 0;
                first = None;
                continue;
            }
            first.get_or_insert_with(Instant::now);
            n += 1;
        }
    });
    let tcp = TcpListener::bind((ip, TCP_SINK))?;
    println!("{{\"ready\": true}}");
    std::io::stdout().flush()?;
    for s in tcp.incoming() {
        let mut s = s?;
        let mut b = vec![0u8; 1 << 20];
        let (mut n, mut first) = (0u64, None::<Instant>);
        loop {
            match s.read(&mut b) {
                Ok(0) | Err(_) => break,
                Ok(k) => {
                    first.get_or_insert_with(Instant::now);
                    n += k as u64;
                }
            }
        }
        let secs = first.map_or(0.0, |t| t.elapsed().as_secs_f64());
        println!("{{\"tcp_bytes\": {n}, \"secs\": {secs}}}");
        std::io::stdout().flush()?;
    }
    Ok(())
}

fn set_rcvbuf(s: &UdpSocket, bytes: i32) -> std::io::Result<()> {
    use std::os::fd::AsRawFd;
    // SAFETY: setsockopt on a socket we own, with a valid pointer and length.
    let r = unsafe {
        libc::setsockopt(
            s.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_RCVBUF,
            &bytes as *const i32 as *const libc::c_void,
            std::mem::size_of::<i32>() as u32,
        )
    };
    if r == 0 {
        Ok(())
    } else {
        Err(std::io::Error::last_os_error())
    }
}

/// A running server child and its output.
#[derive(Debug)]
pub struct Server {
    child: Child,
    out: BufReader<ChildStdout>,
    ip: String,
}

impl Server {
    /// Starts `exe serve IP` (under `prefix`, e.g. `ip netns exec NS` and `taskset -c 0`).
    pub fn start(prefix: &[&str], exe: &str, ip: &str) -> Result<Server, String> {
        let (cmd, args) = match prefix.split_first() {
            Some((c, rest)) => (*c, rest.to_vec()),
            None => (exe, vec![]),
        };
        let mut c = Command::new(cmd);
        c.args(&args);
        if !prefix.is_empty() {
            c.arg(exe);
        }
        let mut child = c
            .args(["serve", ip])
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .stdin(Stdio::null())
            .spawn()
            .map_err(|e| format!("{cmd}: {e}"))?;
        let mut out = BufReader::new(child.stdout.take().ok_or("no stdout")?);
        let mut line = String::new();
        out.read_line(&mut line).map_err(|e| e.to_string())?;
        if !line.contains("ready") {
            let _ = child.kill();
            let _ = child.wait();
            return Err(format!(
                "the kernel baseline server did not start: {line:?}"
            ));
        }
        Ok(Server {
            child,
            out,
            ip: ip.to_string(),
        })
    }

    fn addr(&self, port: u16) -> SocketAddr {
        format!("{}:{port}", self.ip)
            .parse()
            .expect("valid address")
    }

    fn next_line(&mut self) -> Result<Value, String> {
        let mut line = String::new();
        self.out.read_line(&mut line).map_err(|e| e.to_string())?;
        serde_json::from_str(&line).map_err(|e| format!("{e}: {line:?}"))
    }

    /// UDP ping-pong of `size`-byte datagrams: half round trips in microseconds (after a
    /// warm-up of a tenth as many).
    pub fn udp_pingpong(&mut self, size: usize, iters: usize) -> Result<Vec<f64>, String> {
        let s = UdpSocket::bind("0.0.0.0:0").map_err(|e| e.to_string())?;
        s.connect(self.addr(ECHO)).map_err(|e| e.to_string())?;
        s.set_read_timeout(Some(Duration::from_secs(2)))
            .map_err(|e| e.to_string())?;
        let msg = vec![0x5au8; size];
        let mut b = vec![0u8; size.max(64)];
        let mut out = Vec::with_capacity(iters);
        for k in 0..iters + iters / 10 {
            let t = Instant::now();
            s.send(&msg).map_err(|e| e.to_string())?;
            s.recv(&mut b).map_err(|e| format!("UDP echo: {e}"))?;
            if k >= iters / 10 {
                out.push(t.elapsed().as_nanos() as f64 / 2.0 / 1000.0);
            }
        }
        Ok(out)
    }

    /// One TCP stream of 64 KiB writes for `secs`: Gb/s as the receiver counted them.
    pub fn tcp_stream(&mut self, secs: f64) -> Result<f64, String> {
        let mut s = TcpStream::connect(self.addr(TCP_SINK)).map_err(|e| e.to_string())?;
        let chunk = vec![0u8; 65536];
        let t = Instant::now();
        while t.elapsed().as_secs_f64() < secs {
            s.write_all(&chunk).map_err(|e| e.to_string())?;
        }
        drop(s);
        let v = self.next_line()?;
        let (n, d) = (v["tcp_bytes"].as_f64(), v["secs"].as_f64());
        match (n, d) {
            (Some(n), Some(d)) if d > 0.0 => Ok(n * 8.0 / d / 1e9),
            _ => Err(format!("TCP sink: {v}")),
        }
    }

    /// `size`-byte UDP datagrams sent as fast as one thread can for `secs`: the receiver's
    /// rate in messages per second.
    pub fn udp_stream(&mut self, size: usize, secs: f64) -> Result<f64, String> {
        let s = UdpSocket::bind("0.0.0.0:0").map_err(|e| e.to_string())?;
        s.connect(self.addr(UDP_SINK)).map_err(|e| e.to_string())?;
        let msg = vec![0u8; size];
        let t = Instant::now();
        while t.elapsed().as_secs_f64() < secs {
            for _ in 0..64 {
                let _ = s.send(&msg);
            }
        }
        std::thread::sleep(Duration::from_millis(200));
        for _ in 0..3 {
            let _ = s.send(END);
            std::thread::sleep(Duration::from_millis(50));
        }
        let v = self.next_line()?;
        match (v["udp_msgs"].as_f64(), v["secs"].as_f64()) {
            (Some(n), Some(d)) if d > 0.0 => Ok(n / d),
            _ => Err(format!("UDP sink: {v}")),
        }
    }

    /// Stops the child (it is ours) and waits.
    pub fn stop(mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Pins the calling thread to `cpu`.
pub fn pin_thread(cpu: usize) {
    // SAFETY: a zeroed cpu_set_t is valid; CPU_SET writes inside it; sched_setaffinity(0)
    // applies to the calling thread only.
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        libc::CPU_SET(cpu, &mut set);
        libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set);
    }
}
