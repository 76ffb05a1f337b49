//! Typed access to a node's attributes. Each accessor checks the attribute's type and reports the attribute
//! by name when it is of the wrong type or out of range.

use super::error::{NResult, NodeError};
use super::proto::{attribute_proto::AttributeType, AttributeProto, NodeProto, TensorProto};

/// Bound on window attributes (kernel sizes, strides, dilations, pads, output shapes): far beyond any real
/// model, small enough that products with tensor dimensions stay in range.
pub const MAX_WINDOW_ATTR: usize = 1 << 24;

/// A node's attributes, looked up by name.
pub struct Attrs<'a> {
    node: &'a NodeProto,
}

fn type_name(a: &AttributeProto) -> &'static str {
    a.r#type.and_then(|t| AttributeType::try_from(t).ok()).map(|t| t.as_str_name()).unwrap_or("UNDEFINED")
}

impl<'a> Attrs<'a> {
    pub fn new(node: &'a NodeProto) -> Self {
        Attrs { node }
    }

    pub fn get(&self, name: &str) -> Option<&'a AttributeProto> {
        self.node.attribute.iter().find(|a| a.name.as_deref() == Some(name))
    }

    pub fn has(&self, name: &str) -> bool {
        self.get(name).is_some()
    }

    /// The attribute's declared type, falling back (for IR version 1 files, which had no type field) to the
    /// field that is set.
    fn kind(a: &AttributeProto) -> Option<AttributeType> {
        if let Some(t) = a.r#type.and_then(|t| AttributeType::try_from(t).ok()) {
            if t != AttributeType::Undefined {
                return Some(t);
            }
        }
        if a.f.is_some() {
            Some(AttributeType::Float)
        } else if a.i.is_some() {
            Some(AttributeType::Int)
        } else if a.s.is_some() {
            Some(AttributeType::String)
        } else if a.t.is_some() {
            Some(AttributeType::Tensor)
        } else if !a.floats.is_empty() {
            Some(AttributeType::Floats)
        } else if !a.ints.is_empty() {
            Some(AttributeType::Ints)
        } else {
            None
        }
    }

    fn expect(&self, name: &str, want: AttributeType) -> NResult<Option<&'a AttributeProto>> {
        let Some(a) = self.get(name) else { return Ok(None) };
        let k = Self::kind(a);
        // An empty INTS/FLOATS list may be serialized with no type (an empty repeated field is not written).
        if k == Some(want) || (k.is_none() && matches!(want, AttributeType::Ints | AttributeType::Floats)) {
            Ok(Some(a))
        } else {
            Err(NodeError::attr(name, format!("expected type {}, got {}", want.as_str_name(), type_name(a))))
        }
    }

    pub fn int(&self, name: &str) -> NResult<Option<i64>> {
        Ok(self.expect(name, AttributeType::Int)?.map(|a| a.i.unwrap_or(0)))
    }

    pub fn int_or(&self, name: &str, default: i64) -> NResult<i64> {
        Ok(self.int(name)?.unwrap_or(default))
    }

    pub fn float(&self, name: &str) -> NResult<Option<f32>> {
        Ok(self.expect(name, AttributeType::Float)?.map(|a| a.f.unwrap_or(0.0)))
    }

    pub fn float_or(&self, name: &str, default: f32) -> NResult<f32> {
        Ok(self.float(name)?.unwrap_or(default))
    }

    pub fn ints(&self, name: &str) -> NResult<Option<Vec<i64>>> {
        Ok(self.expect(name, AttributeType::Ints)?.map(|a| a.ints.clone()))
    }

    pub fn floats(&self, name: &str) -> NResult<Option<Vec<f32>>> {
        Ok(self.expect(name, AttributeType::Floats)?.map(|a| a.floats.clone()))
    }

    pub fn string(&self, name: &str) -> NResult<Option<String>> {
        match self.expect(name, AttributeType::String)? {
            None => Ok(None),
            Some(a) => String::from_utf8(a.s.clone().unwrap_or_default())
                .map(Some)
                .map_err(|_| NodeError::attr(name, "string is not UTF-8")),
        }
    }

    pub fn tensor(&self, name: &str) -> NResult<Option<&'a TensorProto>> {
        Ok(self.expect(name, AttributeType::Tensor)?.and_then(|a| a.t.as_ref()))
    }

    /// A list of non-negative integers (kernel shapes, strides, pads...), each checked to be at most
    /// [`MAX_WINDOW_ATTR`], so window arithmetic on them cannot overflow.
    pub fn usizes(&self, name: &str) -> NResult<Option<Vec<usize>>> {
        match self.ints(name)? {
            None => Ok(None),
            Some(v) => v
                .iter()
                .map(|&x| match usize::try_from(x) {
                    Ok(u) if u <= MAX_WINDOW_ATTR => Ok(u),
                    Ok(_) => Err(NodeError::attr(name, format!("value {x} in {v:?} is out of range"))),
                    Err(_) => Err(NodeError::attr(name, format!("negative value {x} in {v:?}"))),
                })
                .collect::<NResult<Vec<_>>>()
                .map(Some),
        }
    }

    /// A list of positive integers (strides, dilations).
    pub fn positive(&self, name: &str) -> NResult<Option<Vec<usize>>> {
        let v = self.usizes(name)?;
        if let Some(v) = &v {
            if v.contains(&0) {
                return Err(NodeError::attr(name, format!("values must be positive, got {v:?}")));
            }
        }
        Ok(v)
    }
}

/// Normalizes an axis in `-rank..rank` to `0..rank`.
pub fn norm_axis(axis: i64, rank: usize, attr: &str) -> NResult<usize> {
    let r = rank as i64;
    if axis < -r || axis >= r {
        return Err(NodeError::attr(attr, format!("axis {axis} is out of range for rank {rank}")));
    }
    Ok(if axis < 0 { (axis + r) as usize } else { axis as usize })
}

/// Normalizes a list of axes, rejecting duplicates; the result keeps the given order.
pub fn norm_axes(axes: &[i64], rank: usize, attr: &str) -> NResult<Vec<usize>> {
    let mut out = Vec::with_capacity(axes.len());
    for &a in axes {
        let n = norm_axis(a, rank, attr)?;
        if out.contains(&n) {
            return Err(NodeError::attr(attr, format!("axis {a} appears twice in {axes:?}")));
        }
        out.push(n);
    }
    Ok(out)
}
