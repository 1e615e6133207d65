//! Every container and codec other than GIF and WebP through the `ffmpeg` executable: spawned
//! without a shell (arguments passed as they are, the file name after `-i`), `ffprobe` (beside it) for
//! the stream's size, frame count and rate, and the frames read as raw RGB from a pipe. Both
//! run under the caller's time limit and are killed past it; stderr is kept (its first 4 KiB)
//! for the error message.
//!
//! Frames are decoded as stored: no rotation from the container's metadata (`-noautorotate`)
//! and no frame rate conversion (`-vsync passthrough`), so frame `i` is the stream's `i`-th.

use super::VideoInfo;
use crate::image::RgbImage;
use crate::{Error, Result};
use serde_json::Value;
use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

/// The environment variable naming the `ffmpeg` executable (when no path is given).
pub const FFMPEG_ENV: &str = "QWEN3_VL_FFMPEG";

/// Finds `ffmpeg`: `given`, else `$QWEN3_VL_FFMPEG`, else the first `ffmpeg` on `PATH`.
pub fn find_ffmpeg(given: Option<&Path>) -> Option<PathBuf> {
    if let Some(p) = given {
        return Some(p.to_path_buf());
    }
    if let Some(p) = std::env::var_os(FFMPEG_ENV).filter(|p| !p.is_empty()) {
        return Some(PathBuf::from(p));
    }
    on_path("ffmpeg")
}

fn on_path(exe: &str) -> Option<PathBuf> {
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path).map(|d| d.join(exe)).find(|p| p.is_file())
}

pub(super) struct Ffmpeg {
    ffmpeg: PathBuf,
    ffprobe: PathBuf,
}

impl Ffmpeg {
    /// The executables, or an error naming what is missing and how to give it.
    pub(super) fn locate(given: Option<&Path>, name: &str) -> Result<Ffmpeg> {
        let missing = |what: &str| Error::Video {
            file: name.to_string(),
            msg: format!("{}: videos other than GIF and WebP are decoded by ffmpeg; install it (e.g. `apt install ffmpeg`) or name it with --ffmpeg PATH or {}", what, FFMPEG_ENV),
        };
        let ffmpeg = find_ffmpeg(given).ok_or_else(|| missing("no ffmpeg on PATH"))?;
        if !ffmpeg.is_file() {
            return Err(missing(&format!("ffmpeg not found at {}", ffmpeg.display())));
        }
        let beside = ffmpeg.with_file_name(if ffmpeg.extension().map_or(false, |e| e == "exe") { "ffprobe.exe" } else { "ffprobe" });
        let ffprobe = if beside.is_file() { beside } else { on_path("ffprobe").ok_or_else(|| missing(&format!("no ffprobe beside {} or on PATH", ffmpeg.display())))? };
        Ok(Ffmpeg { ffmpeg, ffprobe })
    }

    /// The first video stream's size, frame count (the container's, else counted packets),
    /// average frame rate and duration.
    pub(super) fn probe(&self, path: &Path, name: &str, timeout: Duration) -> Result<VideoInfo> {
        let mut cmd = Command::new(&self.ffprobe);
        cmd.args(["-v", "error", "-count_packets", "-select_streams", "v:0", "-show_entries", "stream=width,height,avg_frame_rate,r_frame_rate,nb_frames,nb_read_packets,duration:format=duration", "-of", "json", "-i"]).arg(path);
        let mut out = Vec::new();
        let status = run(cmd, name, "ffprobe", timeout, &mut |r| r.read_to_end(&mut out).map(|_| false))?;
        let fail = |msg: String| Error::Video { file: name.to_string(), msg };
        if !status.0 {
            return Err(fail(format!("ffprobe cannot read it as a video: {}", status.1.trim())));
        }
        let v: Value = serde_json::from_slice(&out).map_err(|e| fail(format!("ffprobe printed no JSON ({})", e)))?;
        let s = v.get("streams").and_then(|s| s.get(0)).ok_or_else(|| fail("no video stream".into()))?;
        let num = |v: Option<&Value>| -> Option<f64> {
            match v? {
                Value::Number(n) => n.as_f64(),
                Value::String(s) => s.parse().ok(),
                _ => None,
            }
        };
        let rate = |key: &str| -> Option<f64> {
            let s = s.get(key)?.as_str()?;
            let (a, b) = s.split_once('/').unwrap_or((s, "1"));
            let (a, b): (f64, f64) = (a.parse().ok()?, b.parse().ok()?);
            Some(a / b).filter(|r| r.is_finite() && *r > 0.0)
        };
        let width = num(s.get("width")).unwrap_or(0.0) as usize;
        let height = num(s.get("height")).unwrap_or(0.0) as usize;
        let frames = num(s.get("nb_frames")).filter(|&n| n > 0.0).or_else(|| num(s.get("nb_read_packets"))).unwrap_or(0.0) as usize;
        let duration = num(s.get("duration")).or_else(|| num(v.get("format").and_then(|f| f.get("duration")))).unwrap_or(0.0);
        let fps = rate("avg_frame_rate").or_else(|| rate("r_frame_rate")).or_else(|| Some(frames as f64 / duration).filter(|r| r.is_finite() && *r > 0.0));
        let fps = fps.ok_or_else(|| fail("ffprobe gives the video stream no frame rate".into()))?;
        let duration = if duration > 0.0 { duration } else { frames as f64 / fps };
        Ok(VideoInfo { width, height, frames, fps, duration })
    }

    /// Decodes the first video stream to RGB frames of `info`'s size, handing each to `visit`
    /// with its index until it returns false (ffmpeg is then stopped) or the stream ends.
    pub(super) fn decode(&self, path: &Path, name: &str, info: &VideoInfo, timeout: Duration, visit: &mut dyn FnMut(usize, RgbImage) -> bool) -> Result<()> {
        let mut cmd = Command::new(&self.ffmpeg);
        cmd.args(["-v", "error", "-nostdin", "-noautorotate", "-i"]).arg(path).args(["-map", "0:v:0", "-vsync", "passthrough", "-f", "rawvideo", "-pix_fmt", "rgb24", "-"]);
        let size = info.width * info.height * 3;
        let mut done = 0usize;
        let mut stopped = false;
        let status = run(cmd, name, "ffmpeg", timeout, &mut |r| {
            let mut buf = vec![0u8; size];
            loop {
                match read_full(r, &mut buf)? {
                    0 => return Ok(false),
                    n if n < size => return Err(std::io::Error::new(std::io::ErrorKind::UnexpectedEof, format!("a frame ended after {} of {} bytes", n, size))),
                    _ => {}
                }
                let img = RgbImage::new(info.width, info.height, buf.clone()).expect("w·h·3 bytes");
                let more = visit(done, img);
                done += 1;
                if !more {
                    stopped = true;
                    return Ok(true);
                }
            }
        })?;
        if !status.0 && !stopped && done == 0 {
            return Err(Error::Video { file: name.to_string(), msg: format!("ffmpeg cannot decode it: {}", status.1.trim()) });
        }
        if !status.0 && !stopped {
            log::warn!("{}: ffmpeg stopped after {} frames: {}", name, done, status.1.trim());
        }
        Ok(())
    }
}

/// Reads until `buf` is full or the stream ends; the bytes read.
fn read_full(r: &mut dyn Read, buf: &mut [u8]) -> std::io::Result<usize> {
    let mut n = 0;
    while n < buf.len() {
        match r.read(&mut buf[n..]) {
            Ok(0) => break,
            Ok(k) => n += k,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(n)
}

/// Runs `cmd` with stdout read by `read` and stderr collected. `read` returns whether the
/// process may be stopped at once (it has what it needs); otherwise it is waited for. It is
/// killed past `timeout` in any case. Returns whether it exited successfully and its stderr
/// (at most 4 KiB).
fn run(mut cmd: Command, name: &str, tool: &str, timeout: Duration, read: &mut dyn FnMut(&mut dyn Read) -> std::io::Result<bool>) -> Result<(bool, String)> {
    let fail = |msg: String| Error::Video { file: name.to_string(), msg };
    let mut child = cmd.stdin(Stdio::null()).stdout(Stdio::piped()).stderr(Stdio::piped()).spawn().map_err(|e| fail(format!("cannot run {}: {}", tool, e)))?;
    let mut stdout = child.stdout.take().expect("piped");
    let mut stderr = child.stderr.take().expect("piped");
    let err_thread = std::thread::spawn(move || {
        let mut kept = Vec::new();
        let mut buf = [0u8; 4096];
        while let Ok(n) = stderr.read(&mut buf) {
            if n == 0 {
                break;
            }
            let room = 4096usize.saturating_sub(kept.len());
            kept.extend_from_slice(&buf[..n.min(room)]);
        }
        String::from_utf8_lossy(&kept).into_owned()
    });
    // the watchdog owns the child: it kills it at the deadline, or when told to, or waits for
    // its exit once the reading is over (its output closed)
    let (tx, rx) = mpsc::channel::<bool>();
    let watchdog = std::thread::spawn(move || {
        let start = Instant::now();
        let kill_now = match rx.recv_timeout(timeout) {
            Ok(kill) => kill,
            Err(_) => true, // the deadline (or the reader is gone)
        };
        if !kill_now {
            while start.elapsed() < timeout {
                if let Ok(Some(s)) = child.try_wait() {
                    return (s.success(), false);
                }
                std::thread::sleep(Duration::from_millis(2));
            }
        }
        let _ = child.kill();
        let _ = child.wait();
        (false, start.elapsed() >= timeout)
    });
    let res = read(&mut stdout);
    drop(stdout);
    let _ = tx.send(!matches!(res, Ok(false)));
    let (ok, timed_out) = watchdog.join().map_err(|_| fail(format!("the {} watchdog panicked", tool)))?;
    let err_text = err_thread.join().unwrap_or_default();
    if timed_out {
        return Err(fail(format!("{} did not finish within {:.0} s (the time limit)", tool, timeout.as_secs_f64())));
    }
    res.map_err(|e| fail(format!("reading {}'s output: {}", tool, e)))?;
    Ok((ok, err_text))
}
