//! MNIST from its four uncompressed IDX files (`train-images-idx3-ubyte`,
//! `train-labels-idx1-ubyte`, `t10k-images-idx3-ubyte`, `t10k-labels-idx1-ubyte`), read from a
//! folder the user downloaded them to.

use crate::data::{ImageItem, PIXELS, SIDE};
use std::path::{Path, PathBuf};

/// Reads an IDX file (MNIST's format): magic, dimensions, then u8 values.
pub fn read_idx(path: &Path) -> Result<(Vec<usize>, Vec<u8>), String> {
    let bytes = std::fs::read(path).map_err(|e| format!("{}: {e}", path.display()))?;
    if bytes.len() < 4 || bytes[0] != 0 || bytes[1] != 0 || bytes[2] != 0x08 {
        return Err(format!(
            "{}: not an uncompressed unsigned-byte IDX file (gunzip the .gz first)",
            path.display()
        ));
    }
    let ndim = bytes[3] as usize;
    let header = 4 + 4 * ndim;
    if bytes.len() < header {
        return Err(format!("{}: truncated IDX header", path.display()));
    }
    let dims: Vec<usize> = (0..ndim)
        .map(|i| u32::from_be_bytes(bytes[4 + 4 * i..8 + 4 * i].try_into().unwrap()) as usize)
        .collect();
    let count: usize = dims.iter().product();
    if bytes.len() != header + count {
        return Err(format!(
            "{}: expected {count} values for dimensions {dims:?}, found {}",
            path.display(),
            bytes.len() - header
        ));
    }
    Ok((dims, bytes[header..].to_vec()))
}

/// Finds `stem` in `dir`, accepting MNIST's `-idx` and `.idx` spellings.
fn find_idx(dir: &Path, stem: &str, kind: &str) -> Result<PathBuf, String> {
    for name in [
        format!("{stem}-{kind}-ubyte"),
        format!("{stem}.{kind}-ubyte"),
    ] {
        let path = dir.join(&name);
        if path.exists() {
            return Ok(path);
        }
    }
    Err(format!(
        "{}: no {stem}-{kind}-ubyte (download MNIST and gunzip it into this directory)",
        dir.display()
    ))
}

/// Loads up to `limit` MNIST images of the `split` ("train" or "t10k").
pub fn load_mnist(dir: &Path, split: &str, limit: usize) -> Result<Vec<ImageItem>, String> {
    let (idims, images) = read_idx(&find_idx(dir, &format!("{split}-images"), "idx3")?)?;
    let (ldims, labels) = read_idx(&find_idx(dir, &format!("{split}-labels"), "idx1")?)?;
    if idims.len() != 3 || idims[1] != SIDE || idims[2] != SIDE || ldims != [idims[0]] {
        return Err(format!(
            "MNIST {split}: unexpected dimensions {idims:?} / {ldims:?}"
        ));
    }
    Ok(images
        .chunks_exact(PIXELS)
        .zip(labels)
        .take(limit)
        .map(|(px, label)| ImageItem {
            pixels: px.iter().map(|&v| v as f32 / 255.0).collect(),
            label: label as usize,
        })
        .collect())
}
