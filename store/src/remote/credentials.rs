//! Credentials for the remote tier: from the environment, or from a credentials file that only its owner can
//! read; never from the URL ([`super::url`] refuses one that carries them).
//!
//! The names, the same in the environment and in the file:
//! - `TESSERA_REMOTE_USER`, `TESSERA_REMOTE_PASSWORD`: a Redis ACL user and its password (a password alone:
//!   Redis's `default` user, `requirepass`), or WebDAV basic authentication.
//! - `TESSERA_REMOTE_TOKEN`: a WebDAV bearer token (`Authorization: Bearer …`).
//! - `AWS_ACCESS_KEY_ID`, `AWS_SECRET_ACCESS_KEY`, and optionally `AWS_SESSION_TOKEN`: S3's access key (the
//!   standard names, so that an S3 setup's environment works as it is).
//!
//! The file (`--remote-credentials FILE`, `TESSERA_REMOTE_CREDENTIALS`) holds `NAME=VALUE` lines (blank lines
//! and `#` comments ignored; a value may be wrapped in matching single or double quotes). It is refused when it
//! is not a regular file or when its group or others have any access to it (as ssh refuses such a private
//! key). When a file is named it is the only source: no name is also taken from the environment, so what
//! authenticates is always one place's.
//!
//! Secrets are held in [`Secret`], whose `Debug` prints `***`; errors name files, lines and variable names,
//! never a value.

use std::collections::BTreeMap;
use std::fmt;
use std::path::{Path, PathBuf};

/// The environment variable for `--remote-credentials`.
pub const CREDENTIALS_ENV: &str = "TESSERA_REMOTE_CREDENTIALS";
pub const USER_ENV: &str = "TESSERA_REMOTE_USER";
pub const PASSWORD_ENV: &str = "TESSERA_REMOTE_PASSWORD";
pub const TOKEN_ENV: &str = "TESSERA_REMOTE_TOKEN";
pub const AWS_ACCESS_KEY_ID: &str = "AWS_ACCESS_KEY_ID";
pub const AWS_SECRET_ACCESS_KEY: &str = "AWS_SECRET_ACCESS_KEY";
pub const AWS_SESSION_TOKEN: &str = "AWS_SESSION_TOKEN";

/// Every name a credential can have.
pub const NAMES: [&str; 6] = [USER_ENV, PASSWORD_ENV, TOKEN_ENV, AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY, AWS_SESSION_TOKEN];

/// A secret value: shown as `***` by `Debug`, and has no `Display`.
#[derive(Clone, PartialEq, Eq)]
pub struct Secret(String);

impl Secret {
    pub fn new(s: impl Into<String>) -> Secret {
        Secret(s.into())
    }
    /// The value, for the one place that sends it to the server.
    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl fmt::Debug for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("***")
    }
}

/// The credentials for a remote, by name (see the module doc), and where they came from.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Credentials {
    pub user: Option<String>,
    pub password: Option<Secret>,
    pub token: Option<Secret>,
    pub access_key_id: Option<String>,
    pub secret_access_key: Option<Secret>,
    pub session_token: Option<Secret>,
    /// The file they were read from (None: the environment, or none at all).
    pub file: Option<PathBuf>,
}

/// Credentials that cannot be used: the file or variables at fault, and why (never a value).
#[derive(Debug, thiserror::Error)]
#[error("remote credentials {from}: {why}")]
pub struct CredentialsError {
    /// `file PATH` or `in the environment`.
    pub from: String,
    pub why: String,
}

impl Credentials {
    /// The credentials `file` holds when one is named, else those of this process's environment.
    pub fn load(file: Option<&Path>) -> Result<Credentials, CredentialsError> {
        match file {
            Some(f) => Credentials::from_file(f),
            None => Ok(Credentials::from_lookup(|name| std::env::var(name).ok())),
        }
    }

    /// The credentials a lookup of the names gives (the environment's, or a test's); empty values are unset.
    pub fn from_lookup(lookup: impl Fn(&str) -> Option<String>) -> Credentials {
        let get = |name: &str| lookup(name).filter(|v| !v.is_empty());
        Credentials {
            user: get(USER_ENV),
            password: get(PASSWORD_ENV).map(Secret),
            token: get(TOKEN_ENV).map(Secret),
            access_key_id: get(AWS_ACCESS_KEY_ID),
            secret_access_key: get(AWS_SECRET_ACCESS_KEY).map(Secret),
            session_token: get(AWS_SESSION_TOKEN).map(Secret),
            file: None,
        }
    }

    /// Reads a credentials file (see the module doc), after checking that only its owner can read it.
    pub fn from_file(path: &Path) -> Result<Credentials, CredentialsError> {
        let err = |why: String| CredentialsError { from: format!("file {}", path.display()), why };
        check_private(path).map_err(err)?;
        let text = std::fs::read_to_string(path).map_err(|e| err(format!("cannot read it: {e}")))?;
        let mut values = BTreeMap::new();
        for (i, line) in text.lines().enumerate() {
            let line = line.trim();
            if line.is_empty() || line.starts_with('#') {
                continue;
            }
            let n = i + 1;
            let Some((name, value)) = line.split_once('=') else {
                return Err(err(format!("line {n}: expected NAME=VALUE")));
            };
            let name = name.trim();
            if !NAMES.contains(&name) {
                // The name is shown only when it looks like one: a line could be a stray secret.
                let shown = if name.bytes().all(|b| b.is_ascii_uppercase() || b.is_ascii_digit() || b == b'_') { format!("'{name}'") } else { "its name".into() };
                return Err(err(format!("line {n}: unknown name {shown} (names: {})", NAMES.join(", "))));
            }
            if values.insert(name, unquote(value.trim()).to_string()).is_some() {
                return Err(err(format!("line {n}: {name} given twice")));
            }
        }
        let mut c = Credentials::from_lookup(|name| values.get(name).cloned());
        c.file = Some(path.to_path_buf());
        Ok(c)
    }

    /// Where these came from, for messages.
    pub fn source(&self) -> String {
        match &self.file {
            Some(f) => format!("file {}", f.display()),
            None => "in the environment".into(),
        }
    }

    /// Whether any credential is set.
    pub fn is_empty(&self) -> bool {
        self.user.is_none() && self.password.is_none() && self.token.is_none() && self.access_key_id.is_none() && self.secret_access_key.is_none() && self.session_token.is_none()
    }

    fn err(&self, why: impl Into<String>) -> CredentialsError {
        CredentialsError { from: self.source(), why: why.into() }
    }

    /// What a Redis server takes: an ACL user and password, or a password alone. The AWS names, which other
    /// tools share, are ignored unless they came from a file meant for this remote.
    pub(crate) fn for_redis(&self) -> Result<(Option<String>, Option<Secret>), CredentialsError> {
        self.refuse_aws_from_file("a Redis remote")?;
        if self.token.is_some() {
            return Err(self.err(format!("{TOKEN_ENV} is set, but Redis authenticates with {USER_ENV} and {PASSWORD_ENV} (a password alone: the default user)")));
        }
        if self.user.is_some() && self.password.is_none() {
            return Err(self.err(format!("{USER_ENV} is set without {PASSWORD_ENV}")));
        }
        Ok((self.user.clone(), self.password.clone()))
    }

    /// What a WebDAV server takes: basic authentication (user and password) or a bearer token.
    pub(crate) fn for_webdav(&self) -> Result<WebdavAuth, CredentialsError> {
        self.refuse_aws_from_file("a WebDAV remote")?;
        match (&self.user, &self.password, &self.token) {
            (None, None, None) => Ok(WebdavAuth::None),
            (_, _, Some(t)) if self.user.is_none() && self.password.is_none() => Ok(WebdavAuth::Bearer(t.clone())),
            (_, _, Some(_)) => Err(self.err(format!("both {TOKEN_ENV} and {USER_ENV}/{PASSWORD_ENV} are set: give one"))),
            (Some(u), Some(p), None) => Ok(WebdavAuth::Basic(u.clone(), p.clone())),
            (Some(_), None, None) => Err(self.err(format!("{USER_ENV} is set without {PASSWORD_ENV}"))),
            (None, Some(_), None) => Err(self.err(format!("{PASSWORD_ENV} is set without {USER_ENV} (WebDAV basic authentication needs both)"))),
        }
    }

    /// What S3 takes: an access key (id and secret, both or neither) and an optional session token.
    pub(crate) fn for_s3(&self) -> Result<Option<S3Key>, CredentialsError> {
        if self.user.is_some() || self.password.is_some() || self.token.is_some() {
            return Err(self.err(format!("an S3 remote authenticates with {AWS_ACCESS_KEY_ID} and {AWS_SECRET_ACCESS_KEY}, not {USER_ENV}, {PASSWORD_ENV} or {TOKEN_ENV}")));
        }
        match (&self.access_key_id, &self.secret_access_key) {
            (Some(id), Some(secret)) => Ok(Some(S3Key { id: id.clone(), secret: secret.clone(), session_token: self.session_token.clone() })),
            (None, None) if self.session_token.is_none() => Ok(None),
            (None, None) => Err(self.err(format!("{AWS_SESSION_TOKEN} is set without {AWS_ACCESS_KEY_ID} and {AWS_SECRET_ACCESS_KEY}"))),
            (Some(_), None) => Err(self.err(format!("{AWS_ACCESS_KEY_ID} is set without {AWS_SECRET_ACCESS_KEY}"))),
            (None, Some(_)) => Err(self.err(format!("{AWS_SECRET_ACCESS_KEY} is set without {AWS_ACCESS_KEY_ID}"))),
        }
    }

    fn refuse_aws_from_file(&self, what: &str) -> Result<(), CredentialsError> {
        if self.file.is_some() && (self.access_key_id.is_some() || self.secret_access_key.is_some() || self.session_token.is_some()) {
            return Err(self.err(format!("AWS_* names are for an s3:// remote, not {what}")));
        }
        Ok(())
    }
}

/// How a WebDAV client authenticates.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum WebdavAuth {
    None,
    Basic(String, Secret),
    Bearer(Secret),
}

/// An S3 access key.
#[derive(Clone, Debug)]
pub(crate) struct S3Key {
    pub id: String,
    pub secret: Secret,
    pub session_token: Option<Secret>,
}

fn unquote(v: &str) -> &str {
    for q in ['"', '\''] {
        if let Some(inner) = v.strip_prefix(q).and_then(|r| r.strip_suffix(q)) {
            return inner;
        }
    }
    v
}

/// Refuses a file that holds secrets when it is not a regular file or its group or others have any access to
/// it (read, write or execute: as ssh does for private keys). `Err` says why and what to do; the caller names
/// the file.
#[cfg(unix)]
pub(crate) fn check_private(path: &Path) -> Result<(), String> {
    use std::os::unix::fs::PermissionsExt;
    let meta = std::fs::metadata(path).map_err(|e| format!("cannot read it: {e}"))?;
    if !meta.is_file() {
        return Err("not a regular file".into());
    }
    let mode = meta.permissions().mode() & 0o777;
    if mode & 0o077 != 0 {
        return Err(format!("it holds secrets, but group or others have access to it (mode {mode:04o}): chmod 600 it"));
    }
    Ok(())
}

#[cfg(not(unix))]
pub(crate) fn check_private(path: &Path) -> Result<(), String> {
    std::fs::metadata(path).map(|_| ()).map_err(|e| format!("cannot read it: {e}"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    fn write(dir: &Path, name: &str, text: &str, mode: u32) -> PathBuf {
        let p = dir.join(name);
        std::fs::write(&p, text).unwrap();
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(mode)).unwrap();
        p
    }

    #[test]
    fn a_private_file_is_read_and_a_shared_one_refused_naming_its_mode() {
        let t = tempfile::tempdir().unwrap();
        let text = "# the cache's ACL user\nTESSERA_REMOTE_USER=tessera\nTESSERA_REMOTE_PASSWORD = \"s3cret pw\"\n\n";
        let p = write(t.path(), "creds", text, 0o600);
        let c = Credentials::from_file(&p).unwrap();
        assert_eq!((c.user.as_deref(), c.password.as_ref().map(Secret::expose)), (Some("tessera"), Some("s3cret pw")));
        assert_eq!(c.for_redis().unwrap().0.as_deref(), Some("tessera"));
        assert!(!format!("{c:?}").contains("s3cret"), "Debug never shows a secret: {c:?}");
        for mode in [0o640, 0o604, 0o660, 0o610] {
            let p = write(t.path(), &format!("creds-{mode:o}"), text, mode);
            let e = Credentials::from_file(&p).unwrap_err().to_string();
            assert!(e.contains(&p.display().to_string()) && e.contains(&format!("mode {mode:04o}")) && e.contains("chmod 600"), "{e}");
        }
        let e = Credentials::from_file(t.path()).unwrap_err().to_string();
        assert!(e.contains("not a regular file"), "{e}");
        let e = Credentials::from_file(&t.path().join("absent")).unwrap_err().to_string();
        assert!(e.contains("cannot read it"), "{e}");
    }

    #[test]
    fn bad_lines_are_named_never_shown() {
        let t = tempfile::tempdir().unwrap();
        for (text, says) in [
            ("hunter2\n", "line 1: expected NAME=VALUE"),
            ("# c\nTESSERA_REMOTE_PASWORD=hunter2\n", "line 2: unknown name 'TESSERA_REMOTE_PASWORD'"),
            ("pass word=hunter2\n", "line 1: unknown name its name"),
            ("TESSERA_REMOTE_PASSWORD=a\nTESSERA_REMOTE_PASSWORD=hunter2\n", "line 2: TESSERA_REMOTE_PASSWORD given twice"),
        ] {
            let p = write(t.path(), "c", text, 0o600);
            let e = Credentials::from_file(&p).unwrap_err().to_string();
            assert!(e.contains(says) && !e.contains("hunter2"), "{text:?}: {e}");
        }
    }

    #[test]
    fn each_service_takes_its_own_names() {
        let env = |pairs: &[(&str, &str)]| {
            let m: BTreeMap<String, String> = pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
            Credentials::from_lookup(move |n| m.get(n).cloned())
        };
        let c = env(&[(USER_ENV, "u"), (PASSWORD_ENV, "p"), (AWS_ACCESS_KEY_ID, "ambient")]);
        assert_eq!(c.for_webdav().unwrap(), WebdavAuth::Basic("u".into(), Secret::new("p")));
        assert!(c.for_redis().is_ok(), "AWS_* in the environment belongs to other tools: ignored");
        assert!(c.for_s3().unwrap_err().to_string().contains("not TESSERA_REMOTE_USER"));
        assert_eq!(env(&[(TOKEN_ENV, "t")]).for_webdav().unwrap(), WebdavAuth::Bearer(Secret::new("t")));
        assert!(env(&[(TOKEN_ENV, "t")]).for_redis().is_err());
        assert!(env(&[(TOKEN_ENV, "t"), (USER_ENV, "u"), (PASSWORD_ENV, "p")]).for_webdav().unwrap_err().to_string().contains("give one"));
        assert!(env(&[(USER_ENV, "u")]).for_redis().unwrap_err().to_string().contains("without TESSERA_REMOTE_PASSWORD"));
        assert_eq!(env(&[(PASSWORD_ENV, "p")]).for_redis().unwrap(), (None, Some(Secret::new("p"))));
        let k = env(&[(AWS_ACCESS_KEY_ID, "id"), (AWS_SECRET_ACCESS_KEY, "sk")]).for_s3().unwrap().unwrap();
        assert_eq!((k.id.as_str(), k.secret.expose(), k.session_token), ("id", "sk", None));
        assert!(env(&[(AWS_ACCESS_KEY_ID, "id")]).for_s3().unwrap_err().to_string().contains("without AWS_SECRET_ACCESS_KEY"));
        assert!(env(&[]).for_s3().unwrap().is_none() && env(&[]).is_empty());
        assert_eq!(env(&[(USER_ENV, "")]).user, None, "an empty variable is unset");
    }
}
