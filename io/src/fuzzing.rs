//! The decoders of weir-io, as the fuzz targets (`fuzz/`) and the mutation
//! test (`tests/fuzz_decoders.rs`) drive them; see
//! [`weir_core::fuzzing`] for what each must hold to. **Not a stable
//! API**: it exists for those two and may change with any release.

use std::io::Cursor;
use std::path::Path;

use weir_core::fuzzing::{Decoder, Scratch};

use crate::lines::{BadRecords, LineInfo, ParseError};
use crate::nexmark::{parse_event, write_event};
use crate::twophase::{FileTxn, SqliteTxn};
use crate::wal::codec::{self, check_segment_header, SinkState, SEGMENT_HEADER_BYTES};
use crate::FileSource;

/// 1 MiB: serde's cautious preallocation of one sequence (see
/// [`TWOPHASE_STATE`]).
const SEQ_PREALLOC: usize = 1 << 20;

/// The decoders of weir-io.
pub const DECODERS: &[Decoder] = &[
    WAL_SEGMENT,
    WAL_MARKER,
    WAL_SINK_STATE,
    TWOPHASE_STATE,
    FILE_LINES,
    FILE_OFFSET,
    NEXMARK_JSON,
    KAFKA_OFFSET,
    KAFKA_RECORDS,
    KAFKA_MARKER,
];

/// A WAL segment file: its header checked (as segment 1 of subtask 0),
/// then its frames read back by the log's reader, to the end and to a
/// position halfway, and by [`codec::decode_all`], which must agree.
/// Bound: 64 KiB + 8 x the input (the reader's buffer grows only while
/// one frame fills it, so a length field of 16 MiB in a short segment
/// does not allocate 16 MiB).
pub const WAL_SEGMENT: Decoder = Decoder {
    name: "wal_segment",
    decode: wal_segment,
    fix_checksums: |b| fix_wal_segment(b),
    max_alloc: |len| (64 << 10) + 8 * len,
};

/// A WAL sink's commit marker file (two 40-byte slots). Bound: 4 KiB
/// (error messages only; a marker is never copied).
pub const WAL_MARKER: Decoder = Decoder {
    name: "wal_marker",
    decode: wal_marker,
    fix_checksums: |b| fix_wal_marker(b),
    max_alloc: |_| 4 << 10,
};

/// A WAL sink's checkpoint state ([`SinkState`], 33 bytes). Bound: 4 KiB.
pub const WAL_SINK_STATE: Decoder = Decoder {
    name: "wal_sink_state",
    decode: wal_sink_state,
    fix_checksums: |b| fix_wal_sink_state(b),
    max_alloc: |_| 4 << 10,
};

/// A two-phase commit sink's checkpoint state: version, postcard-encoded
/// transactions, CRC; decoded with the file target's and the SQLite
/// target's transaction handles. Bound: 64 KiB + 8 x the input + 2 x
/// 1 MiB (serde's cautious preallocation of the list of pending
/// transactions, whatever its length field says, per decoding).
pub const TWOPHASE_STATE: Decoder = Decoder {
    name: "twophase_state",
    decode: twophase_state,
    fix_checksums: |b| fix_twophase_state(b),
    max_alloc: |len| (64 << 10) + 8 * len + 2 * SEQ_PREALLOC,
};

/// The lines of an input file, read by [`FileSource`] in polls of a few
/// records, with a parse function that refuses lines that are not UTF-8
/// or start with `#`: once stopping at the first bad line (the error
/// quotes it), once skipping bad lines into a rejected-records file. Every
/// offset the source gives is checked to resume exactly where it was.
/// Bound: 1 MiB (the read buffer) + 64 KiB + 16 x the input.
pub const FILE_LINES: Decoder = Decoder {
    name: "file_lines",
    decode: file_lines,
    fix_checksums: |_| {},
    max_alloc: |len| crate::files::READ_CHUNK + (64 << 10) + 16 * len,
};

/// A [`FileSource`] offset (as a checkpoint stores it) sought to in a
/// folder of two small files, then the rest read. Bound: 1 MiB (the read
/// buffer) + 64 KiB + 4 x the input.
pub const FILE_OFFSET: Decoder = Decoder {
    name: "file_offset",
    decode: file_offset,
    fix_checksums: |_| {},
    max_alloc: |len| crate::files::READ_CHUNK + (64 << 10) + 4 * len,
};

/// A line of the Nexmark event file format ([`parse_event`]), and each
/// line of a multi-line input as [`crate::nexmark::read_events_file`]
/// reads them; an event parsed is written back and must parse to the same
/// event. Bound: 64 KiB + 8 x the input.
pub const NEXMARK_JSON: Decoder = Decoder {
    name: "nexmark_json",
    decode: nexmark_json,
    fix_checksums: |_| {},
    max_alloc: |len| (64 << 10) + 8 * len,
};

/// A [`crate::KafkaSource`] offset (as a checkpoint stores it) sought to
/// by a fresh subtask (0 of 1, topic `t`); a checkpoint taken right after
/// (before any poll: no broker is contacted) must hold the same offsets,
/// and read back the same again. Bound: 64 KiB + 8 x the input.
pub const KAFKA_OFFSET: Decoder = Decoder {
    name: "kafka_offset",
    decode: kafka_offset,
    fix_checksums: |_| {},
    max_alloc: |len| (64 << 10) + 8 * len,
};

/// Kafka records framed for the exactly-once sink's log and buffers
/// ([`crate::kafka::framing`]): split, and framed again to the same
/// bytes. Bound: 4 KiB + 2 x the input.
pub const KAFKA_RECORDS: Decoder = Decoder {
    name: "kafka_records",
    decode: kafka_records,
    fix_checksums: |_| {},
    max_alloc: |len| (4 << 10) + 2 * len,
};

/// The exactly-once Kafka sink's marker record value (`WKM2`, CRC-32):
/// verified, and encoded again to the same bytes. Bound: 4 KiB (error
/// messages only).
pub const KAFKA_MARKER: Decoder = Decoder {
    name: "kafka_marker",
    decode: kafka_marker,
    fix_checksums: |b| {
        if b.len() == crate::kafka::target::MARKER_BYTES {
            let crc = crc32fast::hash(&b[..28]);
            b[28..].copy_from_slice(&crc.to_le_bytes());
        }
    },
    max_alloc: |_| 4 << 10,
};

/// Segment number and subtask the segment decoder expects (the seeds'
/// own).
const SEG: u64 = 1;
const SUBTASK: u32 = 0;

fn wal_segment(bytes: &[u8]) -> Result<(), String> {
    let header = check_segment_header(&bytes[..bytes.len().min(SEGMENT_HEADER_BYTES)], SEG, SUBTASK);
    let body = bytes.get(SEGMENT_HEADER_BYTES..).unwrap_or_default();
    let all = codec::decode_all(body);
    let len = bytes.len() as u64;
    let start = SEGMENT_HEADER_BYTES as u64;
    let mut reader = crate::wal::LogReader::default();
    let mut result = Ok(());
    for end in [len, start + (len.saturating_sub(start)) / 2] {
        let mut frames = Vec::new();
        let stopped = reader
            .scan(Path::new("segment"), &mut Cursor::new(bytes), start, end, |e, p, at| {
                frames.push((e, p.len(), at));
                Ok(())
            })
            .map_err(|e| e.to_string())?;
        // The reader and decode_all agree on every frame they both see.
        for (i, &(e, n, at)) in frames.iter().enumerate() {
            let (ae, ap) = all.frames[i];
            assert_eq!((e, n), (ae, ap.len()), "frame {i} read differently");
            assert!(at <= end, "frame {i} ends at {at}, past {end}");
        }
        if end == len {
            assert_eq!(frames.len(), all.frames.len(), "frames read to the end");
            assert_eq!(stopped.is_none(), all.stop.is_none(), "where reading stopped");
        }
        // An end position halfway may well cut a frame: only the scan to
        // the end decides.
        if let (Some(s), true) = (stopped, end == len) {
            result = Err(format!("byte {}: {}", s.offset, s.reason));
        }
    }
    header?;
    result
}

fn fix_wal_segment(b: &mut [u8]) {
    if b.len() < SEGMENT_HEADER_BYTES {
        return;
    }
    let c = crc32fast::hash(&b[0..20]);
    b[20..24].copy_from_slice(&c.to_le_bytes());
    let mut at = SEGMENT_HEADER_BYTES;
    while at + codec::HEADER_BYTES <= b.len() {
        let len = u32::from_le_bytes(b[at + 4..at + 8].try_into().expect("4 bytes")) as usize;
        let end = at + codec::HEADER_BYTES + len;
        if len > codec::MAX_PAYLOAD_BYTES || end > b.len() {
            break;
        }
        let c = crc32fast::hash(&b[at + 4..end]);
        b[at..at + 4].copy_from_slice(&c.to_le_bytes());
        at = end;
    }
}

fn wal_marker(bytes: &[u8]) -> Result<(), String> {
    crate::wal::decode_marker(bytes)
        .map(|_| ())
        .map_err(|(at, reason)| format!("byte {at}: {reason}"))
}

fn fix_wal_marker(b: &mut [u8]) {
    for slot in b.chunks_exact_mut(40) {
        if slot.iter().any(|&x| x != 0) {
            let c = crc32fast::hash(&slot[4..]);
            slot[0..4].copy_from_slice(&c.to_le_bytes());
        }
    }
}

fn wal_sink_state(bytes: &[u8]) -> Result<(), String> {
    SinkState::decode(bytes).map(|_| ())
}

fn fix_wal_sink_state(b: &mut [u8]) {
    if b.len() == codec::STATE_BYTES {
        let c = crc32fast::hash(&b[..29]);
        b[29..33].copy_from_slice(&c.to_le_bytes());
    }
}

fn twophase_state(bytes: &[u8]) -> Result<(), String> {
    let file = crate::twophase::decode_state::<FileTxn>(1, bytes).map(|_| ());
    let sqlite = crate::twophase::decode_state::<SqliteTxn>(1, bytes).map(|_| ());
    file.or(sqlite).map_err(|e| e.to_string())
}

/// The CRC of a two-phase state is over every byte before it.
fn fix_twophase_state(b: &mut [u8]) {
    if b.len() >= 5 {
        let n = b.len() - 4;
        let c = crc32fast::hash(&b[..n]);
        b[n..].copy_from_slice(&c.to_le_bytes());
    }
}

/// A line: refused if it is not UTF-8 or starts with `#`; else its number
/// and length.
fn parse_line(line: &[u8], info: &LineInfo<'_>) -> Result<(u64, usize), ParseError> {
    let text = std::str::from_utf8(line).map_err(|e| ParseError::new(format!("not UTF-8: {e}")))?;
    if text.starts_with('#') {
        return Err(ParseError::new("a comment\twith a tab"));
    }
    Ok((info.line_number, text.len()))
}

/// [`parse_line`] as a function pointer.
type ParseFn = fn(&[u8], &LineInfo<'_>) -> Result<(u64, usize), ParseError>;
type Lines = FileSource<(u64, usize), ParseFn>;

/// Reads `src` to its end in polls of `batch`; the records, and the
/// offset before each poll with how many records came before it.
#[allow(clippy::type_complexity)]
fn read_all(src: &mut Lines, batch: usize, limit: usize) -> crate::Result<(Vec<(u64, usize)>, Vec<(Vec<u8>, usize)>)> {
    let mut records = Vec::new();
    let mut offsets = Vec::new();
    for _ in 0..=limit {
        offsets.push((src.encode_offset(), records.len()));
        let before = records.len();
        let mut out = Vec::new();
        let done = src.poll_lines(&mut out, batch, 0)? == weir_core::SourcePoll::Done;
        records.extend(out);
        if done {
            return Ok((records, offsets));
        }
        assert!(records.len() > before, "a poll that is not done returned nothing");
    }
    panic!("the source was not done after {limit} polls");
}

fn file_lines(bytes: &[u8]) -> Result<(), String> {
    let scratch = Scratch::new()?;
    let path = scratch.path().join("input.txt");
    std::fs::write(&path, bytes).map_err(|e| e.to_string())?;
    let parse: ParseFn = parse_line;
    // At most one record per byte, plus the end.
    let limit = bytes.len() + 2;

    // Skipping bad lines: every line is a record or a rejected line.
    let rejected = scratch.path().join("rejected.tsv");
    let mut skip = FileSource::new(&path, 0, 1, parse).bad_records(BadRecords::Skip {
        rejected: rejected.clone(),
    });
    let (kept, _) = read_all(&mut skip, 5, limit).map_err(|e| e.to_string())?;
    drop(skip);
    let lines = bytes.split(|&b| b == b'\n').count() - usize::from(bytes.ends_with(b"\n") || bytes.is_empty());
    let rejected_lines = std::fs::read(&rejected).map_or(0, |r| r.iter().filter(|&&b| b == b'\n').count());
    assert_eq!(kept.len() + rejected_lines, lines, "lines kept and rejected");

    // Stopping at the first bad line; every offset resumes exactly.
    let mut src = FileSource::new(&path, 0, 1, parse);
    let read = read_all(&mut src, 3, limit);
    // One source (and read buffer) at a time.
    drop(src);
    let (records, offsets) = match &read {
        Ok((r, o)) => (r.as_slice(), o.as_slice()),
        Err(_) => (&[][..], &[][..]),
    };
    for (offset, before) in offsets.iter().step_by(offsets.len() / 4 + 1) {
        let mut again = FileSource::new(&path, 0, 1, parse);
        again.seek_to(offset).map_err(|e| e.to_string())?;
        let (rest, _) = read_all(&mut again, 7, limit).map_err(|e| e.to_string())?;
        assert_eq!(rest, records[*before..], "resumed from an offset");
    }
    read.map(|_| ()).map_err(|e| e.to_string())
}

fn file_offset(bytes: &[u8]) -> Result<(), String> {
    let scratch = Scratch::new()?;
    let dir = scratch.path().join("input");
    std::fs::create_dir_all(&dir).map_err(|e| e.to_string())?;
    for (name, text) in [("a.txt", "1\n22\n333\n"), ("b.txt", "x\n#y\nz"), (".hidden", "h\n")] {
        std::fs::write(dir.join(name), text).map_err(|e| e.to_string())?;
    }
    let parse: ParseFn = parse_line;
    let mut src = FileSource::new(&dir, 0, 1, parse).bad_records(BadRecords::Skip {
        rejected: scratch.path().join("rejected.tsv"),
    });
    src.seek_to(bytes).map_err(|e| e.to_string())?;
    read_all(&mut src, 2, 32).map(|_| ()).map_err(|e| e.to_string())
}

type KafkaParse = fn(&[u8], &crate::KafkaRecordInfo<'_>) -> Result<u64, ParseError>;

fn kafka_subtask() -> crate::KafkaSource<u64, KafkaParse> {
    let parse: KafkaParse = |_, _| Ok(0);
    crate::KafkaSource::new(crate::KafkaSourceConfig::new("127.0.0.1:1", "t"), 0, 1, parse)
}

fn kafka_offset(bytes: &[u8]) -> Result<(), String> {
    use weir_core::Source;
    let mut src = kafka_subtask();
    src.seek(bytes).map_err(|e| e.to_string())?;
    let again = src.checkpoint_offset(1);
    if bytes[1] != 0 {
        // Started: the same offsets (the flag written back as 1).
        assert_eq!(
            again[2..],
            bytes[2..],
            "a restored offset checkpointed before the first poll"
        );
    }
    let mut back = kafka_subtask();
    back.seek(&again)
        .unwrap_or_else(|e| panic!("an offset the source wrote is refused: {e}"));
    assert_eq!(
        back.checkpoint_offset(2),
        again,
        "an offset read back and written again"
    );
    Ok(())
}

fn kafka_records(bytes: &[u8]) -> Result<(), String> {
    use crate::kafka::framing::{encode, Records};
    let mut again = Vec::with_capacity(bytes.len());
    for r in Records::new(bytes) {
        let (key, value) = r.map_err(|at| format!("a record runs past the end, from byte {at}"))?;
        encode(key, value, &mut again);
    }
    assert_eq!(again, bytes, "records framed again");
    Ok(())
}

fn kafka_marker(bytes: &[u8]) -> Result<(), String> {
    use crate::kafka::target::{decode_marker, encode_marker};
    let c = decode_marker(bytes).map_err(|(at, reason)| format!("byte {at}: {reason}"))?;
    assert_eq!(encode_marker(c)[..], bytes[..], "a marker encoded again");
    Ok(())
}

fn nexmark_json(bytes: &[u8]) -> Result<(), String> {
    // As `read_events_file` reads a file: no line after the last `\n`.
    let body = bytes.strip_suffix(b"\n").unwrap_or(bytes);
    if body.contains(&b'\n') {
        for (i, line) in body.split(|&b| b == b'\n').enumerate() {
            parse_event(line).map_err(|e| format!("line {}: {e}", i + 1))?;
        }
        return Ok(());
    }
    let event = parse_event(bytes)?;
    let mut line = Vec::new();
    write_event(&event, &mut line);
    assert_eq!(parse_event(&line).as_ref(), Ok(&event), "an event written back");
    Ok(())
}

/// Seeds for the decoders of this crate, `(decoder, name, bytes)`, made by
/// weir's own encoders: WAL segments, markers and sink states, two-phase
/// states of both targets, file-source inputs and offsets, Nexmark event
/// lines. Writes scratch files under `dir`.
pub fn seeds(dir: &Path) -> Result<Vec<weir_core::fuzzing::Seed>, String> {
    let mut out = Vec::new();
    // WAL: a segment of a few frames of two epochs, and one cut mid-frame.
    let mut seg = codec::segment_header(SEG, SUBTASK).to_vec();
    for (epoch, payload) in [
        (1u64, &b"alpha,1\n"[..]),
        (1, b"beta,22\n"),
        (2, b""),
        (2, b"gamma,333\n"),
    ] {
        codec::encode_frame(&mut seg, epoch, payload).map_err(|n| format!("frame of {n} bytes"))?;
    }
    out.push(("wal_segment", "four-frames".to_string(), seg.clone()));
    out.push((
        "wal_segment",
        "bad-torn-tail".to_string(),
        seg[..seg.len() - 5].to_vec(),
    ));
    // Markers: after one commit, and after three (both slots used).
    let path = dir.join("committed");
    let mut marker = crate::wal::Marker::read(path.clone(), true)
        .map_err(|e| e.to_string())?
        .0;
    for epoch in 1..=3u64 {
        let pos = codec::WalPos {
            seg: SEG,
            off: 24 + 40 * epoch,
        };
        marker
            .write(crate::wal::Committed { epoch, pos })
            .map_err(|e| e.to_string())?;
        if epoch == 1 || epoch == 3 {
            let bytes = std::fs::read(&path).map_err(|e| e.to_string())?;
            out.push(("wal_marker", format!("after-{epoch}-commits"), bytes));
        }
    }
    let state = SinkState {
        subtask: SUBTASK,
        epoch: 2,
        end: codec::WalPos { seg: SEG, off: 96 },
    };
    out.push(("wal_sink_state", "epoch-2".to_string(), state.encode()));
    // Two-phase states: pending and open transactions of both targets.
    let files = [
        FileTxn {
            epoch: 2,
            temp: ".part-000-000000002.csv.tmp".into(),
            name: "part-000-000000002.csv".into(),
            bytes: 120,
        },
        FileTxn {
            epoch: 3,
            temp: ".part-000-000000003.csv.tmp".into(),
            name: "part-000-000000003.csv".into(),
            bytes: 0,
        },
    ];
    let encode = |e: weir_core::BoxError| e.to_string();
    let file_state = crate::twophase::encode_state(&crate::twophase::RecordedRef {
        pending: vec![(2, &files[0])],
        open: Some(&files[1]),
    })
    .map_err(encode)?;
    out.push(("twophase_state", "file-pending-and-open".to_string(), file_state));
    let rows = [SqliteTxn { epoch: 4, rows: 10 }, SqliteTxn { epoch: 5, rows: 0 }];
    let sqlite_state = crate::twophase::encode_state(&crate::twophase::RecordedRef {
        pending: vec![(3, &rows[0]), (4, &rows[0])],
        open: Some(&rows[1]),
    })
    .map_err(encode)?;
    out.push(("twophase_state", "sqlite-pending-and-open".to_string(), sqlite_state));
    let empty = crate::twophase::encode_state::<FileTxn>(&crate::twophase::RecordedRef {
        pending: vec![],
        open: None,
    })
    .map_err(encode)?;
    out.push(("twophase_state", "nothing-pending".to_string(), empty));
    // File-source inputs, and offsets taken by the source itself.
    out.push(("file_lines", "plain".to_string(), b"1,one\n2,two\n\n3,three".to_vec()));
    out.push((
        "file_lines",
        "bad-lines".to_string(),
        b"ok\n#comment\n\xff\xfe\nlast\n".to_vec(),
    ));
    out.push(("file_lines", "crlf".to_string(), b"a\r\nb\r\n".to_vec()));
    let scratch = Scratch::new()?;
    let input = scratch.path().join("input");
    std::fs::create_dir_all(&input).map_err(|e| e.to_string())?;
    for (name, text) in [("a.txt", "1\n22\n333\n"), ("b.txt", "x\n#y\nz")] {
        std::fs::write(input.join(name), text).map_err(|e| e.to_string())?;
    }
    let parse: ParseFn = parse_line;
    let mut src = FileSource::new(&input, 0, 1, parse).bad_records(BadRecords::Skip {
        rejected: scratch.path().join("rejected.tsv"),
    });
    let (_, offsets) = read_all(&mut src, 2, 32).map_err(|e| e.to_string())?;
    for (i, (offset, _)) in offsets.iter().enumerate() {
        out.push(("file_offset", format!("poll-{i}"), offset.clone()));
    }
    // Kafka: source offsets (restored, and never started), framed sink
    // records, a marker.
    let parts = [(0, 120, Some(500)), (1, 0, None), (2, 7, Some(7))];
    out.push((
        "kafka_offset",
        "started-three-partitions".to_string(),
        crate::kafka::source::encode_offsets("t", true, &parts),
    ));
    out.push((
        "kafka_offset",
        "not-started".to_string(),
        crate::kafka::source::encode_offsets("t", false, &[]),
    ));
    let mut records = Vec::new();
    for (key, value) in [(&b"k1"[..], &b"1,2,3"[..]), (b"", b"v"), (b"key", b"")] {
        crate::kafka::framing::encode(key, value, &mut records);
    }
    out.push(("kafka_records", "three".to_string(), records));
    let marker = crate::kafka::target::encode_marker(crate::wal::Committed {
        epoch: 7,
        pos: codec::WalPos { seg: 3, off: 4096 },
    });
    out.push(("kafka_marker", "epoch-7".to_string(), marker.to_vec()));
    // Nexmark: one event of each kind, and three lines together.
    let cfg = crate::nexmark::NexmarkConfig::default();
    let mut all = Vec::new();
    for n in 0..50u64 {
        let kind = crate::nexmark::event_kind(n);
        let mut line = Vec::new();
        write_event(&crate::nexmark::event(&cfg, n), &mut line);
        let name = format!("{kind:?}").to_lowercase();
        if !out.iter().any(|(d, s, _)| *d == "nexmark_json" && *s == name) {
            all.extend_from_slice(&line);
            out.push(("nexmark_json", name, line));
        }
    }
    out.push(("nexmark_json", "three-lines".to_string(), all));
    Ok(out)
}
