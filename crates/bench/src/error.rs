//! The one error type of the crate.

use std::io;
use std::path::PathBuf;

/// Everything that can go wrong in `rdmx-bench`.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The command line (or a plan from a peer) was wrong.
    #[error("{0}")]
    Usage(String),
    /// A line of an input file could not be understood.
    #[error("{}:{line}: {msg}", file.display())]
    Parse {
        /// The file.
        file: PathBuf,
        /// 1-based line number.
        line: usize,
        /// What was wrong.
        msg: String,
    },
    /// An input file is wrong as a whole (not one line of it).
    #[error("{}: {msg}", file.display())]
    File {
        /// The file.
        file: PathBuf,
        /// What was wrong.
        msg: String,
    },
    /// A JSON input could not be decoded (the message carries line and column).
    #[error("{}: {source}", file.display())]
    Json {
        /// The file.
        file: PathBuf,
        /// serde_json's error, with line and column.
        #[source]
        source: serde_json::Error,
    },
    /// Reading or writing a file failed.
    #[error("{}: {source}", file.display())]
    Io {
        /// The file or directory.
        file: PathBuf,
        /// The OS error.
        #[source]
        source: io::Error,
    },
    /// A socket operation failed.
    #[error("{what}: {source}")]
    Net {
        /// What was being done.
        what: String,
        /// The OS error.
        #[source]
        source: io::Error,
    },
    /// The peer of a socket-pingpong session broke the protocol.
    #[error("socket-pingpong protocol: {0}")]
    Protocol(String),
    /// Drawing a plot failed.
    #[error("plotting {}: {msg}", file.display())]
    Plot {
        /// The SVG file.
        file: PathBuf,
        /// plotters' message.
        msg: String,
    },
}

/// `Result` with [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;

impl Error {
    /// A [`Error::Parse`] for `file` at `line`.
    pub fn parse(file: impl Into<PathBuf>, line: usize, msg: impl Into<String>) -> Self {
        Error::Parse {
            file: file.into(),
            line,
            msg: msg.into(),
        }
    }

    /// A [`Error::Net`] with context.
    pub fn net(what: impl Into<String>, source: io::Error) -> Self {
        Error::Net {
            what: what.into(),
            source,
        }
    }

    /// An [`Error::Io`] for `file`.
    pub fn io(file: impl Into<PathBuf>, source: io::Error) -> Self {
        Error::Io {
            file: file.into(),
            source,
        }
    }

    /// Exit status for this error: 2 for usage errors, 1 otherwise.
    pub fn exit_code(&self) -> i32 {
        match self {
            Error::Usage(_) => 2,
            _ => 1,
        }
    }
}
