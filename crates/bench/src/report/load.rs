//! Reading a run's raw results (`RunData::load`): every input file, tolerating missing ones.

use super::*;

/// One file of a `PREFIX<SIZE>SUFFIX` family: relative name, size from the name (when
/// asked for), path and text.
pub(super) type FamilyFile = (String, Option<u64>, PathBuf, String);

pub(super) struct Loader<'a> {
    dir: &'a Path,
    missing: Vec<String>,
    empty: Vec<String>,
}

pub(super) fn read_text(path: &Path) -> Result<Option<String>> {
    match fs::read(path) {
        Ok(bytes) => Ok(Some(String::from_utf8_lossy(&bytes).into_owned())),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
        Err(source) => Err(Error::Io {
            file: path.to_path_buf(),
            source,
        }),
    }
}

impl Loader<'_> {
    fn pingpong(&mut self, rel: &str, mode: &str) -> Result<Pingpong> {
        let path = self.dir.join(rel);
        let Some(text) = read_text(&path)? else {
            self.missing.push(rel.to_string());
            return Ok(Pingpong {
                input: rel.into(),
                doc: None,
            });
        };
        let doc = PingpongDoc::from_json(&text, &path)?;
        if doc.mode != mode {
            return Err(Error::File {
                file: path,
                msg: format!("mode is `{}`, expected `{mode}` for this file", doc.mode),
            });
        }
        if doc.results.is_empty() {
            self.empty.push(format!("{rel}: no results"));
        }
        Ok(Pingpong {
            input: rel.into(),
            doc: Some(doc),
        })
    }

    /// Files `sub/PREFIX<SIZE>SUFFIX`, sorted by name; `SIZE` parsed when `sized`.
    /// Records the pattern as missing when there are none.
    fn family(
        &mut self,
        sub: &str,
        prefix: &str,
        suffix: &str,
        sized: bool,
    ) -> Result<Vec<FamilyFile>> {
        let what = if prefix.starts_with("threshold") {
            "<T>"
        } else {
            "<SIZE>"
        };
        let pattern = format!("{sub}/{prefix}{what}{suffix}");
        let dir = self.dir.join(sub);
        let entries = match fs::read_dir(&dir) {
            Ok(e) => e,
            Err(e) if e.kind() == io::ErrorKind::NotFound => {
                self.missing.push(pattern);
                return Ok(Vec::new());
            }
            Err(source) => return Err(Error::Io { file: dir, source }),
        };
        let mut names = Vec::new();
        for entry in entries {
            let entry = entry.map_err(|source| Error::Io {
                file: dir.clone(),
                source,
            })?;
            let Ok(name) = entry.file_name().into_string() else {
                continue;
            };
            if name.len() > prefix.len() + suffix.len()
                && name.starts_with(prefix)
                && name.ends_with(suffix)
            {
                names.push(name);
            }
        }
        names.sort();
        let mut out = Vec::new();
        for name in names {
            let path = dir.join(&name);
            let size = if sized {
                let mid = &name[prefix.len()..name.len() - suffix.len()];
                Some(parse_size(mid).map_err(|e| Error::File {
                    file: path.clone(),
                    msg: format!("cannot read the size from the file name: {e}"),
                })?)
            } else {
                None
            };
            let Some(text) = read_text(&path)? else {
                continue;
            };
            out.push((format!("{sub}/{name}"), size, path, text));
        }
        if out.is_empty() {
            self.missing.push(pattern);
        }
        Ok(out)
    }

    fn note_empty<T>(&mut self, rel: &str, rows: &BySize<T>, what: &str) {
        if rows.is_empty() {
            self.empty.push(format!("{rel}: {what}"));
        }
    }

    fn perftest_lat(&mut self, r: &mut Reference, prefix: &str) -> Result<()> {
        let files = self.family("guest", prefix, ".txt", false)?;
        if files.is_empty() {
            return Ok(());
        }
        let mut all = BySize::default();
        for (rel, _, path, text) in files {
            let rows = parse_perftest_lat(&text, &path)?;
            self.note_empty(&rel, &rows, "no result rows");
            all.merge(rows);
        }
        r.set(BySize {
            rows: all
                .rows
                .into_iter()
                .map(|(s, v)| (s, v.t_typical))
                .collect(),
            unusable: all.unusable,
            failures: all.failures,
        });
        Ok(())
    }

    fn perftest_bw(&mut self, r: &mut Reference, prefix: &str) -> Result<()> {
        let files = self.family("guest", prefix, ".txt", false)?;
        if files.is_empty() {
            return Ok(());
        }
        let mut all = BySize::default();
        for (rel, _, path, text) in files {
            let rows = parse_perftest_bw(&text, &path)?;
            self.note_empty(&rel, &rows, "no result rows");
            all.merge(rows);
        }
        r.set(BySize {
            rows: all
                .rows
                .into_iter()
                .map(|(s, v)| (s, v.bw_avg_mbs))
                .collect(),
            unusable: all.unusable,
            failures: all.failures,
        });
        Ok(())
    }

    fn qperf(&mut self, r: &mut Reference, test: &str, kind: QperfKind) -> Result<()> {
        let rel = format!("guest/qperf-{test}.txt");
        let path = self.dir.join(&rel);
        let Some(text) = read_text(&path)? else {
            self.missing.push(rel);
            return Ok(());
        };
        let mut rows = parse_qperf(&text, &path, test, kind)?;
        self.note_empty(&rel, &rows, "no result blocks");
        for f in &rows.failures {
            self.empty.push(format!("{rel}: {f}"));
        }
        if kind == QperfKind::Bandwidth {
            for v in rows.rows.values_mut() {
                *v /= MB;
            }
        }
        r.set(rows);
        Ok(())
    }

    fn ucx(
        &mut self,
        r: &mut Reference,
        test: &str,
        f: fn(&crate::inputs::UcxFinal) -> f64,
    ) -> Result<()> {
        let files = self.family("host", &format!("ucx-{test}-"), ".txt", true)?;
        if files.is_empty() {
            return Ok(());
        }
        let mut all = BySize::default();
        for (rel, size, path, text) in files {
            let size = size.unwrap_or(0);
            match parse_ucx(&text, &path)? {
                Some(fin) => all.add_value(size, f(&fin)),
                None => {
                    self.empty.push(format!("{rel}: no `Final:` line"));
                    all.unusable.insert(size);
                }
            }
        }
        r.set(all);
        Ok(())
    }

    fn thresholds(&mut self, sub: &str) -> Result<BTreeMap<u64, PingpongDoc>> {
        let mut out = BTreeMap::new();
        for (rel, t, path, text) in self.family(sub, "threshold-", ".json", true)? {
            let doc = PingpongDoc::from_json(&text, &path)?;
            if doc.is_bandwidth() {
                return Err(Error::File {
                    file: path,
                    msg: "a threshold run must be a latency-mode document".into(),
                });
            }
            if doc.results.is_empty() {
                self.empty.push(format!("{rel}: no results"));
            }
            out.insert(t.unwrap_or(0), doc);
        }
        Ok(out)
    }
}

impl BySize<f64> {
    fn add_value(&mut self, size: u64, v: f64) {
        if v > 0.0 && v.is_finite() {
            self.rows.entry(size).or_insert(v);
            self.unusable.remove(&size);
        } else if !self.rows.contains_key(&size) {
            self.unusable.insert(size);
        }
    }
}

pub(super) const INF_WHY: &str = "reported inf/-nan (clock-correlation failure)";
pub(super) const ZERO_WHY: &str = "reported no bandwidth (did not complete)";
pub(super) const UCX_WHY: &str = "has no valid `Final:` line";

impl RunData {
    /// Loads everything in `dir`. `meta.env` must exist; everything else is optional.
    pub fn load(dir: &Path) -> Result<RunData> {
        let meta_path = dir.join("meta.env");
        let meta_text = read_text(&meta_path)?.ok_or_else(|| Error::File {
            file: meta_path.clone(),
            msg: "not found (every run directory needs meta.env)".into(),
        })?;
        let meta = parse_meta(&meta_text, &meta_path)?;
        let mut l = Loader {
            dir,
            missing: Vec::new(),
            empty: Vec::new(),
        };

        // RDMA (guest).
        let lat = l.pingpong("guest/rdmx-lat.json", "latency")?;
        let bw = l.pingpong("guest/rdmx-bw.json", "bandwidth")?;
        let mut ib_lat = Reference::new(
            "ib_send_lat typical",
            "ib_send_lat",
            "guest/ib_send_lat-<SIZE>.txt",
            INF_WHY,
        );
        l.perftest_lat(&mut ib_lat, "ib_send_lat-")?;
        let mut q_lat = Reference::new(
            "qperf rc_lat",
            "qperf rc_lat",
            "guest/qperf-rc_lat.txt",
            ZERO_WHY,
        );
        l.qperf(&mut q_lat, "rc_lat", QperfKind::Latency)?;
        let mut ib_bw = Reference::new(
            "ib_read_bw avg",
            "ib_read_bw",
            "guest/ib_read_bw-<SIZE>.txt",
            ZERO_WHY,
        );
        l.perftest_bw(&mut ib_bw, "ib_read_bw-")?;
        let mut q_bw = Reference::new(
            "qperf rc_bw",
            "qperf rc_bw",
            "guest/qperf-rc_bw.txt",
            ZERO_WHY,
        );
        l.qperf(&mut q_bw, "rc_bw", QperfKind::Bandwidth)?;
        let mut q_rd = Reference::new(
            "qperf rc_rdma_read_bw",
            "qperf rc_rdma_read_bw",
            "guest/qperf-rc_rdma_read_bw.txt",
            ZERO_WHY,
        );
        l.qperf(&mut q_rd, "rc_rdma_read_bw", QperfKind::Bandwidth)?;
        let rdma_thresholds = l.thresholds("guest")?;
        let rdma = Transport {
            name: "rdma",
            title: "RDMA (Soft-RoCE)",
            lat,
            bw,
            lat_refs: vec![ib_lat, q_lat],
            bw_refs: vec![ib_bw, q_bw, q_rd],
            thresholds: rdma_thresholds,
        };

        // TCP (host).
        let lat = l.pingpong("host/rdmx-lat.json", "latency")?;
        let bw = l.pingpong("host/rdmx-bw.json", "bandwidth")?;
        let mut u_lat = Reference::new(
            "ucx tag_lat typical",
            "ucx_perftest tag_lat",
            "host/ucx-tag_lat-<SIZE>.txt",
            UCX_WHY,
        );
        l.ucx(&mut u_lat, "tag_lat", |f| f.typical_us)?;
        let mut u_bw = Reference::new(
            "ucx tag_bw",
            "ucx_perftest tag_bw",
            "host/ucx-tag_bw-<SIZE>.txt",
            UCX_WHY,
        );
        l.ucx(&mut u_bw, "tag_bw", |f| f.bw_overall_mbs)?;
        let sock_lat = l.pingpong("host/socket-lat.json", "latency")?;
        let sock_bw = l.pingpong("host/socket-bw.json", "bandwidth")?;
        let s_lat = Reference::new("socket p50", "socket-pingpong", &sock_lat.input, ZERO_WHY)
            .with_doc(&sock_lat.doc, |r| r.p50_us);
        let s_bw = Reference::new("socket", "socket-pingpong", &sock_bw.input, ZERO_WHY)
            .with_doc(&sock_bw.doc, |r| r.bytes_per_s / MB);
        let tcp_thresholds = l.thresholds("host")?;
        let tcp = Transport {
            name: "tcp",
            title: "TCP (loopback)",
            lat,
            bw,
            lat_refs: vec![u_lat, s_lat],
            bw_refs: vec![u_bw, s_bw],
            thresholds: tcp_thresholds,
        };
        let hotpath = read_text(&dir.join("hotpath.md"))?;
        let endpoints = read_text(&dir.join("endpoints.md"))?;
        let twonode = read_text(&dir.join("twonode.md"))?;
        Ok(RunData {
            meta,
            missing: l.missing,
            empty: l.empty,
            rdma,
            tcp,
            hotpath,
            endpoints,
            twonode,
        })
    }
}
