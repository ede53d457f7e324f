//! One process owns a data dir's queues: the one holding its lock (`hookwise dev`). Two
//! workers on one data dir would each take the other's in-flight messages for abandoned
//! ones; other commands (`hookwise tenant create`) open the database beside the owner.

use std::fs::{File, OpenOptions, TryLockError};
use std::io::{Read, Seek, Write};
use std::path::Path;

/// The lock file's name in the data dir; it holds the owner's process id.
pub const LOCK_FILE: &str = "dev.lock";

/// Held for as long as the process owns the data dir; released when dropped (or when the
/// process dies, however it dies).
#[derive(Debug)]
pub struct DataDirLock {
    _file: File,
}

impl DataDirLock {
    /// Take the lock, or fail saying who holds it.
    pub fn acquire(data_dir: &Path) -> std::io::Result<Self> {
        std::fs::create_dir_all(data_dir)?;
        let path = data_dir.join(LOCK_FILE);
        let mut file = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(&path)?;
        match file.try_lock() {
            Ok(()) => {
                file.set_len(0)?;
                file.rewind()?;
                write!(file, "{}", std::process::id())?;
                file.flush()?;
                Ok(Self { _file: file })
            }
            Err(TryLockError::WouldBlock) => {
                let mut pid = String::new();
                file.read_to_string(&mut pid)?;
                Err(std::io::Error::other(format!(
                    "another hookwise dev (pid {}) is running on the data dir {}: stop it, or give this one its own --data-dir",
                    pid.trim(),
                    data_dir.display()
                )))
            }
            Err(TryLockError::Error(e)) => Err(e),
        }
    }
}
