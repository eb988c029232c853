//! Downloading the canonical AG News archive, or unpacking a copy of it already on disk.
//!
//! The archive is downloaded into a hidden staging directory inside the target directory (same
//! filesystem), unpacked there, and its CSVs are checked against the expected MD5s; only then
//! are the files renamed into place. On any failure the staging directory is removed and the
//! target directory is left as it was.

use std::ffi::OsStr;
use std::fmt;
use std::fs::File;
use std::io::{BufReader, BufWriter, Read, Write};
use std::path::{Component, Path, PathBuf};
use std::time::Duration;

use flate2::read::GzDecoder;
use indicatif::{ProgressBar, ProgressStyle};

use crate::dir::{md5_file, TEST_FILE, TEST_MD5, TRAIN_FILE, TRAIN_MD5};
use crate::error::DataError;

/// Where the canonical `ag_news_csv.tgz` (Zhang, Zhao & LeCun, 2015) is published.
pub const DEFAULT_ARCHIVE_URL: &str = "https://s3.amazonaws.com/fast-ai-nlp/ag_news_csv.tgz";

/// Top-level directory inside the archive.
pub const ARCHIVE_DIR: &str = "ag_news_csv";

/// Files taken from the archive, in the order they are moved into place (the CSVs last).
const ARCHIVE_FILES: [&str; 4] = ["classes.txt", "readme.txt", TEST_FILE, TRAIN_FILE];

/// Settings of [`fetch_with`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FetchOptions {
    /// Where the archive is: an `http://` or `https://` URL, a `file://` URL or a local path.
    pub url: String,
    /// Expected MD5 of `train.csv` (lowercase or uppercase hex).
    pub train_md5: String,
    /// Expected MD5 of `test.csv`.
    pub test_md5: String,
    /// Show a progress bar on stderr.
    pub show_progress: bool,
    /// Give up if no connection is made within this time.
    pub connect_timeout: Duration,
    /// Give up if the server sends nothing for this long.
    pub read_timeout: Duration,
    /// Download even if the directory already holds both CSVs with the expected MD5s.
    pub force: bool,
}

impl Default for FetchOptions {
    fn default() -> Self {
        Self {
            url: DEFAULT_ARCHIVE_URL.to_string(),
            train_md5: TRAIN_MD5.to_string(),
            test_md5: TEST_MD5.to_string(),
            show_progress: false,
            connect_timeout: Duration::from_secs(30),
            read_timeout: Duration::from_secs(60),
            force: false,
        }
    }
}

/// What [`fetch_with`] did.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FetchReport {
    /// The data directory.
    pub dir: PathBuf,
    /// True when verified files were already there and nothing was downloaded.
    pub already_present: bool,
    /// Size of the archive downloaded or read from disk (0 when the files were already there).
    pub downloaded_bytes: u64,
    /// True when the archive was a local file, not a download.
    pub local: bool,
    /// The dataset files now in `dir`.
    pub files: Vec<PathBuf>,
    /// Verified MD5 of `train.csv`.
    pub train_md5: String,
    /// Verified MD5 of `test.csv`.
    pub test_md5: String,
}

impl fmt::Display for FetchReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.already_present {
            writeln!(f, "AG News already present and verified in {}", self.dir.display())?;
        } else {
            writeln!(
                f,
                "{} {:.1} MB and installed AG News in {}",
                if self.local { "Unpacked" } else { "Downloaded" },
                self.downloaded_bytes as f64 / 1e6,
                self.dir.display()
            )?;
        }
        writeln!(f, "  {TRAIN_FILE}  md5 {}  ok", self.train_md5)?;
        write!(f, "  {TEST_FILE}   md5 {}  ok", self.test_md5)
    }
}

/// Installs the archive at `url` (downloaded, or read from disk) into `dir` with the published
/// MD5s; see [`fetch_with`].
pub fn fetch(dir: &Path, url: &str, show_progress: bool) -> Result<FetchReport, DataError> {
    fetch_with(dir, &FetchOptions { url: url.to_string(), show_progress, ..FetchOptions::default() })
}

/// Downloads (or, for a `file://` URL or a path, reads from disk), unpacks and verifies the AG
/// News archive, then moves `train.csv`, `test.csv`,
/// `classes.txt` and `readme.txt` into `dir` (created if needed).
///
/// Fails with [`DataError::Fetch`] on an HTTP error status, a dropped or timed-out connection,
/// a body shorter than its `Content-Length`, an archive that is not a valid `.tgz` or lacks a
/// CSV, or an MD5 mismatch; in every such case nothing is written to `dir`.
pub fn fetch_with(dir: &Path, options: &FetchOptions) -> Result<FetchReport, DataError> {
    if !options.force {
        if let Some(report) = already_present(dir, options) {
            return Ok(report);
        }
    }
    let created_dir = !dir.exists();
    std::fs::create_dir_all(dir).map_err(|e| DataError::io(dir, "cannot create directory", e))?;
    let result = fetch_into(dir, options);
    if result.is_err() && created_dir {
        // Only succeeds if empty: never removes anything but the directory we just made.
        let _ = std::fs::remove_dir(dir);
    }
    result
}

/// The report for a directory that already holds both verified CSVs, if it does.
fn already_present(dir: &Path, options: &FetchOptions) -> Option<FetchReport> {
    let train = dir.join(TRAIN_FILE);
    let test = dir.join(TEST_FILE);
    let train_md5 = md5_file(&train).ok()?;
    let test_md5 = md5_file(&test).ok()?;
    let ok = train_md5.eq_ignore_ascii_case(&options.train_md5) && test_md5.eq_ignore_ascii_case(&options.test_md5);
    ok.then(|| FetchReport {
        dir: dir.to_path_buf(),
        already_present: true,
        downloaded_bytes: 0,
        local: false,
        files: vec![train, test],
        train_md5,
        test_md5,
    })
}

fn fetch_into(dir: &Path, options: &FetchOptions) -> Result<FetchReport, DataError> {
    let fail = |message: String| DataError::Fetch { url: options.url.clone(), message };
    // Removed (with everything in it) when dropped, on success and on every error path.
    let staging = tempfile::Builder::new()
        .prefix(".tandem-fetch-")
        .tempdir_in(dir)
        .map_err(|e| DataError::io(dir, "cannot create a staging directory", e))?;

    let (archive, downloaded_bytes, local) = match ArchiveSource::of(&options.url) {
        ArchiveSource::Http => {
            let archive = staging.path().join("ag_news_csv.tgz");
            let bytes = download(options, &archive)?;
            (archive, bytes, false)
        }
        ArchiveSource::Local(path) => {
            let bytes = std::fs::metadata(&path)
                .map_err(|e| fail(format!("cannot read the archive {}: {e}", path.display())))?
                .len();
            (path, bytes, true)
        }
    };
    let found = unpack(&archive, staging.path()).map_err(&fail)?;
    for required in [TRAIN_FILE, TEST_FILE] {
        if !found.contains(&required) {
            return Err(fail(format!("the archive has no {ARCHIVE_DIR}/{required}")));
        }
    }

    let mut digests = Vec::new();
    for (name, expected) in [(TRAIN_FILE, &options.train_md5), (TEST_FILE, &options.test_md5)] {
        let actual = md5_file(&staging.path().join(name))?;
        if !actual.eq_ignore_ascii_case(expected) {
            return Err(fail(format!(
                "md5 mismatch for {ARCHIVE_DIR}/{name}: expected {}, got {actual}",
                expected.to_ascii_lowercase()
            )));
        }
        digests.push(actual);
    }

    let mut files = Vec::new();
    for name in ARCHIVE_FILES.iter().filter(|n| found.contains(n)) {
        let target = dir.join(name);
        std::fs::rename(staging.path().join(name), &target)
            .map_err(|e| DataError::io(&target, "cannot move the downloaded file into place", e))?;
        files.push(target);
    }
    staging.close().map_err(|e| DataError::io(dir, "cannot remove the staging directory", e))?;

    let test_md5 = digests.pop().unwrap_or_default();
    let train_md5 = digests.pop().unwrap_or_default();
    Ok(FetchReport {
        dir: dir.to_path_buf(),
        already_present: false,
        downloaded_bytes,
        local,
        files,
        train_md5,
        test_md5,
    })
}

/// Where [`FetchOptions::url`] points.
#[derive(Debug, PartialEq, Eq)]
enum ArchiveSource {
    /// An `http://` or `https://` URL, downloaded.
    Http,
    /// A `file://` URL or a path: the archive is read where it is.
    Local(PathBuf),
}

impl ArchiveSource {
    fn of(url: &str) -> Self {
        let lower = url.to_ascii_lowercase();
        if lower.starts_with("http://") || lower.starts_with("https://") {
            return Self::Http;
        }
        // `file:///data/x.tgz` (and `file://localhost/data/x.tgz`) name `/data/x.tgz`.
        let path = match url.get(..7).filter(|scheme| scheme.eq_ignore_ascii_case("file://")) {
            Some(_) => url[7..].strip_prefix("localhost").unwrap_or(&url[7..]),
            None => url,
        };
        Self::Local(PathBuf::from(path))
    }
}

/// Downloads `options.url` to `path`, returning the number of bytes received.
fn download(options: &FetchOptions, path: &Path) -> Result<u64, DataError> {
    let fail = |message: String| DataError::Fetch { url: options.url.clone(), message };
    let agent =
        ureq::AgentBuilder::new().timeout_connect(options.connect_timeout).timeout_read(options.read_timeout).build();
    let response = agent.get(&options.url).call().map_err(|e| match e {
        ureq::Error::Status(code, response) => {
            fail(format!("the server answered HTTP {code} {}", response.status_text()))
        }
        ureq::Error::Transport(t) => fail(format!("cannot download: {t}")),
    })?;
    // With a content encoding the header counts encoded bytes, not the bytes we read.
    let expected_len: Option<u64> = match response.header("Content-Encoding") {
        Some(_) => None,
        None => response.header("Content-Length").and_then(|v| v.trim().parse().ok()),
    };

    let bar = progress_bar(options.show_progress, expected_len);
    let file = File::create(path).map_err(|e| DataError::io(path, "cannot create", e))?;
    let mut out = BufWriter::new(file);
    let mut reader = response.into_reader();
    let mut buf = vec![0u8; 1 << 16];
    let mut received: u64 = 0;
    let of_total = |received: u64| match expected_len {
        Some(len) => format!("{received} of {len} bytes"),
        None => format!("{received} bytes"),
    };
    loop {
        let n = match reader.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(e) => {
                bar.abandon();
                return Err(fail(format!("the download broke off after {}: {e}", of_total(received))));
            }
        };
        out.write_all(&buf[..n]).map_err(|e| DataError::io(path, "cannot write", e))?;
        received += n as u64;
        bar.inc(n as u64);
    }
    out.flush().map_err(|e| DataError::io(path, "cannot write", e))?;
    bar.finish_and_clear();
    if let Some(len) = expected_len {
        if received != len {
            return Err(fail(format!("the download is incomplete: received {}", of_total(received))));
        }
    }
    Ok(received)
}

fn progress_bar(show: bool, len: Option<u64>) -> ProgressBar {
    if !show {
        return ProgressBar::hidden();
    }
    let (bar, template) = match len {
        Some(len) => (ProgressBar::new(len), "{msg} [{bar:40}] {bytes}/{total_bytes} ({bytes_per_sec}, {eta})"),
        None => (ProgressBar::new_spinner(), "{msg} {spinner} {bytes} ({bytes_per_sec})"),
    };
    if let Ok(style) = ProgressStyle::with_template(template) {
        bar.set_style(style.progress_chars("=> "));
    }
    bar.set_message("ag_news_csv.tgz");
    bar
}

/// Extracts the known dataset files from the `.tgz` at `archive` into `into` (flat), never
/// trusting the paths in the archive. Returns the names extracted.
fn unpack(archive: &Path, into: &Path) -> Result<Vec<&'static str>, String> {
    let file = File::open(archive).map_err(|e| format!("cannot open the archive {}: {e}", archive.display()))?;
    let mut tar = tar::Archive::new(GzDecoder::new(BufReader::new(file)));
    let invalid = |e: std::io::Error| format!("the archive is not a valid .tgz: {e}");
    let mut found: Vec<&'static str> = Vec::new();
    for entry in tar.entries().map_err(invalid)? {
        let mut entry = entry.map_err(invalid)?;
        if !entry.header().entry_type().is_file() {
            continue;
        }
        let entry_path = entry.path().map_err(invalid)?.into_owned();
        let components: Vec<Component> = entry_path.components().filter(|c| !matches!(c, Component::CurDir)).collect();
        let file_name = match components.as_slice() {
            [Component::Normal(d), Component::Normal(f)] if *d == OsStr::new(ARCHIVE_DIR) => *f,
            [Component::Normal(f)] => *f,
            _ => continue,
        };
        let Some(name) = ARCHIVE_FILES.iter().copied().find(|n| OsStr::new(n) == file_name) else {
            continue;
        };
        if found.contains(&name) {
            return Err(format!("the archive holds {name} twice"));
        }
        let target = into.join(name);
        let mut out = File::create(&target)
            .map(BufWriter::new)
            .map_err(|e| format!("cannot create {}: {e}", target.display()))?;
        std::io::copy(&mut entry, &mut out)
            .and_then(|_| out.flush())
            .map_err(|e| format!("cannot extract {name} (corrupt or truncated archive?): {e}"))?;
        found.push(name);
    }
    Ok(found)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::csv::read_csv;
    use flate2::write::GzEncoder;
    use flate2::Compression;
    use md5::{Digest, Md5};
    use std::net::TcpListener;

    const TRAIN: &[u8] = b"\"1\",\"World title\",\"World text\"\n\"2\",\"Sports\",\"Game \"\"on\"\"\"\n\"3\",\"Biz\",\"Stocks  #36;5\"\n\"4\",\"Tech\",\"Chips\"\n";
    const TEST: &[u8] = b"\"4\",\"T\",\"D\"\n\"1\",\"W\",\"X\"\n";

    fn md5_hex(data: &[u8]) -> String {
        format!("{:x}", Md5::digest(data))
    }

    fn make_tgz(files: &[(&str, &[u8])]) -> Vec<u8> {
        let mut tar = tar::Builder::new(GzEncoder::new(Vec::new(), Compression::fast()));
        let mut dir_header = tar::Header::new_gnu();
        dir_header.set_entry_type(tar::EntryType::Directory);
        dir_header.set_size(0);
        dir_header.set_mode(0o755);
        dir_header.set_cksum();
        tar.append_data(&mut dir_header, "ag_news_csv/", std::io::empty()).unwrap();
        for (name, data) in files {
            let mut header = tar::Header::new_gnu();
            header.set_size(data.len() as u64);
            header.set_mode(0o644);
            header.set_cksum();
            tar.append_data(&mut header, format!("ag_news_csv/{name}"), *data).unwrap();
        }
        tar.into_inner().unwrap().finish().unwrap()
    }

    fn good_archive() -> Vec<u8> {
        make_tgz(&[
            ("train.csv", TRAIN),
            ("test.csv", TEST),
            ("classes.txt", b"World\nSports\nBusiness\nSci/Tech\n"),
            ("readme.txt", b"readme"),
        ])
    }

    fn http_response(status: &str, declared_len: usize, body: &[u8]) -> Vec<u8> {
        let mut r = format!(
            "HTTP/1.1 {status}\r\nContent-Type: application/x-gzip\r\nContent-Length: {declared_len}\r\nConnection: close\r\n\r\n"
        )
        .into_bytes();
        r.extend_from_slice(body);
        r
    }

    /// Serves `response` to one connection on 127.0.0.1, then stops. Returns the URL.
    fn serve_once(response: Vec<u8>) -> String {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        std::thread::spawn(move || {
            let Ok((mut stream, _)) = listener.accept() else {
                return;
            };
            let _ = stream.set_read_timeout(Some(Duration::from_secs(5)));
            let mut request = Vec::new();
            let mut chunk = [0u8; 1024];
            while !request.windows(4).any(|w| w == b"\r\n\r\n") {
                match stream.read(&mut chunk) {
                    Ok(0) | Err(_) => break,
                    Ok(n) => request.extend_from_slice(&chunk[..n]),
                }
            }
            let _ = stream.write_all(&response);
            let _ = stream.flush();
        });
        format!("http://{addr}/ag_news_csv.tgz")
    }

    fn options(url: String) -> FetchOptions {
        FetchOptions {
            url,
            train_md5: md5_hex(TRAIN),
            test_md5: md5_hex(TEST),
            show_progress: false,
            connect_timeout: Duration::from_secs(5),
            read_timeout: Duration::from_secs(5),
            force: false,
        }
    }

    /// Names in `dir` (empty if it does not exist).
    fn listing(dir: &Path) -> Vec<String> {
        let mut names: Vec<String> = std::fs::read_dir(dir)
            .map(|rd| rd.map(|e| e.unwrap().file_name().to_string_lossy().into_owned()).collect())
            .unwrap_or_default();
        names.sort();
        names
    }

    #[test]
    fn successful_fetch_installs_verified_files() {
        let root = tempfile::tempdir().unwrap();
        let dir = root.path().join("data");
        let archive = good_archive();
        let url = serve_once(http_response("200 OK", archive.len(), &archive));
        let report = fetch_with(&dir, &options(url)).unwrap();
        assert!(!report.already_present);
        assert_eq!(report.downloaded_bytes, archive.len() as u64);
        assert_eq!(report.train_md5, md5_hex(TRAIN));
        assert_eq!(listing(&dir), ["classes.txt", "readme.txt", "test.csv", "train.csv"]);
        assert_eq!(std::fs::read(dir.join("train.csv")).unwrap(), TRAIN);
        let train = read_csv(&dir.join("train.csv")).unwrap();
        assert_eq!(train.len(), 4);
        assert_eq!(train[2].description, "Stocks $5");
        assert!(report.to_string().contains("train.csv"));

        // A second fetch finds the verified files and does not connect (the server is gone).
        let again = fetch_with(&dir, &options("http://127.0.0.1:9/unused".into())).unwrap();
        assert!(again.already_present);
        assert_eq!(again.downloaded_bytes, 0);
    }

    #[test]
    fn a_local_archive_is_unpacked_with_the_same_checks() {
        let root = tempfile::tempdir().unwrap();
        let archive = good_archive();
        let path = root.path().join("ag_news_csv.tgz");
        std::fs::write(&path, &archive).unwrap();
        for (i, url) in [path.display().to_string(), format!("file://{}", path.display())].into_iter().enumerate() {
            let dir = root.path().join(format!("data{i}"));
            let report = fetch_with(&dir, &options(url)).unwrap();
            assert!(report.local && !report.already_present);
            assert_eq!(report.downloaded_bytes, archive.len() as u64);
            assert!(report.to_string().starts_with("Unpacked"), "{report}");
            assert_eq!(listing(&dir), ["classes.txt", "readme.txt", "test.csv", "train.csv"]);
            assert_eq!(std::fs::read(dir.join("test.csv")).unwrap(), TEST);
        }
        // The archive is left where it was.
        assert_eq!(std::fs::read(&path).unwrap(), archive);

        // A wrong md5 and a missing file leave nothing behind.
        let dir = root.path().join("mismatch");
        let mut opts = options(path.display().to_string());
        opts.train_md5 = TRAIN_MD5.to_string();
        let msg = fetch_with(&dir, &opts).unwrap_err().to_string();
        assert!(msg.contains("md5 mismatch") && msg.contains("train.csv"), "{msg}");
        assert!(!dir.exists());
        let missing = root.path().join("nowhere.tgz");
        let msg = fetch_with(&dir, &options(missing.display().to_string())).unwrap_err().to_string();
        assert!(msg.contains("cannot read the archive") && msg.contains("nowhere.tgz"), "{msg}");
        assert!(!dir.exists());
    }

    #[test]
    fn sources_are_told_apart_by_scheme() {
        assert_eq!(ArchiveSource::of("https://example.org/a.tgz"), ArchiveSource::Http);
        assert_eq!(ArchiveSource::of("HTTP://example.org/a.tgz"), ArchiveSource::Http);
        assert_eq!(ArchiveSource::of("file:///data/a.tgz"), ArchiveSource::Local("/data/a.tgz".into()));
        assert_eq!(ArchiveSource::of("file://localhost/data/a.tgz"), ArchiveSource::Local("/data/a.tgz".into()));
        assert_eq!(ArchiveSource::of("downloads/a.tgz"), ArchiveSource::Local("downloads/a.tgz".into()));
    }

    #[test]
    fn truncated_body_leaves_nothing() {
        let root = tempfile::tempdir().unwrap();
        let dir = root.path().join("data");
        std::fs::create_dir(&dir).unwrap();
        let archive = good_archive();
        let url = serve_once(http_response("200 OK", archive.len(), &archive[..archive.len() / 2]));
        let msg = fetch_with(&dir, &options(url)).unwrap_err().to_string();
        assert!(msg.contains("broke off") || msg.contains("incomplete"), "{msg}");
        assert!(msg.contains(&format!("of {} bytes", archive.len())), "{msg}");
        assert!(listing(&dir).is_empty(), "{:?}", listing(&dir));
    }

    #[test]
    fn md5_mismatch_leaves_nothing() {
        let root = tempfile::tempdir().unwrap();
        let dir = root.path().join("new-data");
        let archive = good_archive();
        let url = serve_once(http_response("200 OK", archive.len(), &archive));
        let mut opts = options(url);
        opts.test_md5 = TEST_MD5.to_string();
        let msg = fetch_with(&dir, &opts).unwrap_err().to_string();
        assert!(msg.contains("md5 mismatch") && msg.contains("test.csv") && msg.contains(TEST_MD5), "{msg}");
        assert!(msg.contains(&md5_hex(TEST)), "{msg}");
        // The directory did not exist before and is removed again.
        assert!(!dir.exists());
    }

    #[test]
    fn http_404_is_an_error() {
        let root = tempfile::tempdir().unwrap();
        let dir = root.path().join("data");
        let url = serve_once(http_response("404 Not Found", 9, b"not found"));
        let msg = fetch_with(&dir, &options(url)).unwrap_err().to_string();
        assert!(msg.contains("404"), "{msg}");
        assert!(listing(&dir).is_empty());
    }

    #[test]
    fn bad_gzip_is_an_error() {
        let root = tempfile::tempdir().unwrap();
        let dir = root.path().join("data");
        let body = b"this is not a gzip stream at all".to_vec();
        let url = serve_once(http_response("200 OK", body.len(), &body));
        let msg = fetch_with(&dir, &options(url)).unwrap_err().to_string();
        assert!(msg.contains("not a valid .tgz"), "{msg}");
        assert!(listing(&dir).is_empty());
    }

    #[test]
    fn archive_without_train_csv_is_an_error() {
        let root = tempfile::tempdir().unwrap();
        let dir = root.path().join("data");
        let archive = make_tgz(&[("test.csv", TEST)]);
        let url = serve_once(http_response("200 OK", archive.len(), &archive));
        let msg = fetch_with(&dir, &options(url)).unwrap_err().to_string();
        assert!(msg.contains("no ag_news_csv/train.csv"), "{msg}");
        assert!(listing(&dir).is_empty());
    }

    #[test]
    fn connection_refused_is_an_error() {
        let root = tempfile::tempdir().unwrap();
        let dir = root.path().join("data");
        // Bind then drop, so the port is (almost certainly) closed.
        let port = TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
        let url = format!("http://127.0.0.1:{port}/ag_news_csv.tgz");
        let msg = fetch_with(&dir, &options(url)).unwrap_err().to_string();
        assert!(msg.contains("cannot download"), "{msg}");
        assert!(!dir.exists());
    }
}
