//! Range scans: leaves in key order along their right-sibling links.

use super::*;

impl<K: TreeKey> TreeClientOf<K> {
    /// Up to `limit` entries with keys in `[low, high)`, in key order, as
    /// `(key, value)` pairs; `high = u64::MAX` reaches the last key. Not a
    /// snapshot: every key present throughout the scan is returned, none
    /// absent throughout. Empty, with nothing read, when `low >= high` or
    /// `limit` is 0. Fails with [`TreeError::NotCreated`] before the tree
    /// exists, `Verb` when a verb fails, `Corrupt` for a broken node or
    /// endless restarts.
    pub async fn scan<N: Nic>(
        &mut self,
        ctx: &Ctx<N>,
        low: K,
        high: K,
        limit: usize,
    ) -> Result<Vec<(K, u64)>, TreeError> {
        let st = crate::scratch_scoped!(ctx, self.scan_unscoped(ctx, low, high, limit, false))?;
        Ok(st.out)
    }

    /// [`Self::scan`] with whole values (the tree's `value_bytes` each),
    /// as `(key, value)` pairs in key order. Fails as `scan` does.
    pub async fn scan_values<N: Nic>(
        &mut self,
        ctx: &Ctx<N>,
        low: K,
        high: K,
        limit: usize,
    ) -> Result<Vec<(K, Vec<u8>)>, TreeError> {
        let st = crate::scratch_scoped!(ctx, self.scan_unscoped(ctx, low, high, limit, true))?;
        let vb = self.layout.value_bytes();
        let values = st.values.chunks_exact(vb).map(<[u8]>::to_vec);
        Ok(st.out.into_iter().map(|(k, _)| k).zip(values).collect())
    }

    pub(super) async fn scan_unscoped<N: Nic>(
        &mut self,
        ctx: &Ctx<N>,
        low: K,
        high: K,
        limit: usize,
        whole: bool,
    ) -> Result<Scan<K>, TreeError> {
        let mut st = Scan {
            from: low,
            high,
            limit,
            out: Vec::new(),
            whole,
            values: Vec::new(),
            leaves: 0,
            entries: 0,
        };
        if low >= high || limit == 0 {
            return Ok(st);
        }
        if self.tree.has_stranded() {
            self.release_stranded(ctx, false).await;
        }
        let r = self.scan_walk(ctx, &mut st).await;
        // The fill of the leaves this scan took guides the next scan's
        // first read (a moving mean over about 8 scans).
        if let Some(seen) = (st.entries * 16).checked_div(st.leaves) {
            self.leaf_fill_16 = (self.leaf_fill_16 * 7 + seen.max(16) as u32) / 8;
        }
        r.map(|()| st)
    }

    /// The scan's walk over the leaves: batches of leaves named by the
    /// index cache, single leaves along sibling links or from the root.
    /// Bounded by passes in a row that take no leaf, not by passes: a
    /// scan that crosses more than `MAX_RESTARTS` leaves is progress.
    async fn scan_walk<N: Nic>(&mut self, ctx: &Ctx<N>, st: &mut Scan<K>) -> Result<(), TreeError> {
        // A right sibling to go on to (a leaf ended before `from`).
        let mut next: Option<GlobalAddr> = None;
        // The right sibling of the last leaf taken, where `from` now is:
        // read when the cache names no batch, instead of a descent from
        // the root, where the index cache has no room for a node (each
        // leaf took a descent). Not where it has room: a descent fills
        // it, and later scans' batches are named by what it holds (read
        // along the links instead, range-100 at the paper's scale took
        // 0.5% more round trips a scan).
        let links = self.tree.cfg.cache_bytes < self.layout.node_bytes();
        let mut link: Option<GlobalAddr> = None;
        let mut idle = 0;
        while idle < MAX_RESTARTS {
            let walk = match next.take() {
                Some(addr) => self.scan_leaves(ctx, &[addr], st).await?,
                None => self.scan_pass(ctx, st, link.take()).await?,
            };
            match walk {
                Walk::Done => return Ok(()),
                Walk::On(taken, on, last) => {
                    next = on;
                    if taken > 0 {
                        idle = 0;
                        link = last.filter(|_| links);
                    } else {
                        idle += 1;
                    }
                }
            }
        }
        Err(TreeError::Corrupt {
            addr: GlobalAddr::NULL,
            why: "scan restarted without end",
        })
    }

    /// One pass of the walk from `from`: the leaves the index cache names,
    /// read in one round trip (Sherman's range query fetches the leaves
    /// in parallel), as many as the entries still wanted need at the fill
    /// seen so far, counting half a leaf before `from`; else one leaf:
    /// `link` (the last leaf taken's sibling, where there is no cache),
    /// or the one found through the cache or from the root.
    async fn scan_pass<N: Nic>(
        &mut self,
        ctx: &Ctx<N>,
        st: &mut Scan<K>,
        link: Option<GlobalAddr>,
    ) -> Result<Walk, TreeError> {
        let fill = st
            .entries
            .checked_div(st.leaves)
            .unwrap_or(self.leaf_fill_16 as usize / 16)
            .max(1);
        let want = st.limit - st.out.len();
        let k = (want.saturating_add(fill / 2))
            .div_ceil(fill)
            .clamp(1, PARALLEL_LEAVES);
        let mut addrs = [GlobalAddr::NULL; PARALLEL_LEAVES];
        let k = self.tree.cache.leaves_from(st.from, &mut addrs[..k]);
        if k > 1 {
            let walk = self.scan_leaves(ctx, &addrs[..k], st).await?;
            match walk {
                Walk::On(0, None, _) => {}
                _ => return Ok(walk),
            }
        }
        if let Some(addr) = link {
            return self.scan_leaves(ctx, &[addr], st).await;
        }
        let addr = self.find_level(ctx, st.from, 0).await?;
        let walk = self.scan_leaves(ctx, &[addr], st).await?;
        if let Walk::On(0, None, _) = walk {
            // Not a leaf, or one beyond `from`: from the root.
            self.tree.cache.invalidate_covering(1, st.from);
            self.root_hint = 0;
        }
        Ok(walk)
    }

    /// Reads the leaves at `addrs` in one round trip (each until its copy
    /// is consistent) and takes their entries in order while each one
    /// covers `from`, the next key wanted: a leaf that does not (a split
    /// or a stale address) ends the walk there, and the caller goes on
    /// from `from`. Each leaf taken is one that held `from` when it was
    /// read, as a walk along sibling links checks, so the scan's promise
    /// (every key present throughout is returned, none absent throughout)
    /// holds however the leaves were found. `Done` when the limit or
    /// `high` is reached, else `On(leaves taken, the right sibling to go
    /// on to)`.
    async fn scan_leaves<N: Nic>(
        &mut self,
        ctx: &Ctx<N>,
        addrs: &[GlobalAddr],
        st: &mut Scan<K>,
    ) -> Result<Walk, TreeError> {
        let mut bufs: Vec<Buf> = Vec::with_capacity(addrs.len());
        for &a in addrs {
            check_node_addr(a)?;
            match ctx.alloc_for_read(self.layout.node_bytes()) {
                Ok(buf) => bufs.push(buf),
                // A small scratch window reads fewer leaves at once.
                Err(_) if !bufs.is_empty() => break,
                Err(e) => return Err(e.into()),
            }
        }
        let addrs = &addrs[..bufs.len()];
        let mut b = ctx.batch();
        let ops: Vec<_> = addrs
            .iter()
            .zip(bufs.drain(..))
            .map(|(&a, buf)| b.read(a, buf))
            .collect();
        let mut done = b.submit().await?;
        bufs.extend(ops.into_iter().map(|op| done.take_buf(op)));
        drop(done);
        let mut taken = 0;
        // The right sibling of the last leaf taken: where `from` is now.
        let mut link: Option<GlobalAddr> = None;
        for (&addr, buf) in addrs.iter().zip(bufs) {
            // A torn copy is read again alone.
            let buf = if self.check_node(addr, &buf)? {
                buf
            } else {
                self.stats.read_retries += 1;
                self.read_node_into(ctx, addr, buf).await?
            };
            let n = self.node(buf.as_slice());
            let from = st.from;
            if !n.is_leaf() || from < n.low() || from >= n.high() {
                // Go on along a link: this leaf's when it ended before
                // `from`, else the last taken one's (a leaf split off
                // since the cached node was read lies between).
                let on = if n.is_leaf() && from >= n.high() {
                    Some(self.sibling_of(&n, addr)?)
                } else {
                    link
                };
                if on.is_some() {
                    self.stats.sibling_hops += 1;
                }
                if addrs.len() > 1 {
                    // The cached node named a leaf that no longer follows.
                    self.tree.cache.invalidate_covering(1, from);
                }
                return Ok(Walk::On(taken, on, link));
            }
            taken += 1;
            st.leaves += 1;
            // Up to the leaf's own end as well as the scan's: a copy
            // holding a key at or past its high fence (none should) would
            // repeat it, or put it out of order, before the next leaf's.
            let (mut part, held) = leaf_part(&n, from, st.high.min(n.high()));
            st.entries += held;
            part.truncate(st.limit - st.out.len());
            if st.whole {
                let vb = self.layout.value_bytes();
                for &(_, _, i) in &part {
                    let at = st.values.len();
                    st.values.resize(at + vb, 0);
                    n.value_into(i, &mut st.values[at..]);
                }
            }
            st.out.extend(part.into_iter().map(|(k, v, _)| (k, v)));
            if st.out.len() >= st.limit {
                return Ok(Walk::Done);
            }
            if n.high() >= st.high {
                return Ok(Walk::Done);
            }
            st.from = n.high();
            link = Some(self.sibling_of(&n, addr)?);
        }
        Ok(Walk::On(taken, None, link))
    }
}

/// A leaf copy's entries with keys in `from..high`, as (key, value's first 8
/// bytes, slot), in key order and each key once; and how many entries the
/// copy held in all (in range or not), from the same walk. A copy can hold
/// one key in two slots: a leaf's entries are written in place, one line
/// each, without a node version of their own, and a READ takes its lines at
/// different instants (in address order on a NIC; on emu a line changed while
/// the others were copied is copied again alone, later), so a copy can hold a
/// key's entry from before its owner deleted it in one slot and the entry its
/// owner put next, in a higher free slot, from after. Each was current at
/// some moment of the scan, so either may stand (`history::map`'s S3); both
/// would break the scan's strict order (S1). Seen as duplicate keys in `loch
/// node`'s self-checking scans on emu, with three compute processes on two
/// CPUs, the two slots in different lines of one leaf (most likely a reader
/// preempted between its copy and a line's second copy).
fn leaf_part<K: TreeKey>(n: &Node<'_, K>, from: K, high: K) -> (Vec<(K, u64, usize)>, usize) {
    let mut held = 0;
    let mut part: Vec<(K, u64, usize)> = n
        .slots()
        .inspect(|_| held += 1)
        .map(|i| (n.key(i), n.value(i), i))
        .filter(|&(k, _, _)| k >= from && k < high)
        .collect();
    part.sort_unstable_by_key(|&(k, _, _)| k);
    part.dedup_by_key(|e| e.0);
    (part, held)
}

/// A scan in progress.
pub(super) struct Scan<K> {
    /// The next key wanted.
    from: K,
    high: K,
    limit: usize,
    out: Vec<(K, u64)>,
    /// Whether to keep whole values, and the values of `out`, one after
    /// another (`value_bytes` each).
    whole: bool,
    values: Vec<u8>,
    /// Leaves taken, and the entries they held (in range or not).
    leaves: usize,
    entries: usize,
}

/// How far [`TreeClientOf::scan_leaves`] got.
enum Walk {
    /// The scan is complete.
    Done,
    /// Leaves taken; the scan goes on from the updated `from`, at the
    /// right sibling when there is one to follow; and the right sibling
    /// of the last leaf taken, where `from` now is.
    On(usize, Option<GlobalAddr>, Option<GlobalAddr>),
}

/// Most leaves a range scan reads in one round trip.
const PARALLEL_LEAVES: usize = 8;

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tree::layout::{Layout, NodeMut, KEY_INFINITY};

    #[test]
    fn a_leaf_copy_holding_a_key_twice_gives_it_once_in_order() {
        let l = Layout::new(8, 8).unwrap();
        let mut b = vec![0u8; l.node_bytes()];
        let mut m = NodeMut::<u64>::new(l, &mut b);
        m.init(0, 0, KEY_INFINITY, GlobalAddr::NULL, 1);
        // Key 7 in slot 3 (before its delete) and slot 26 (its next put),
        // among others, as a torn copy held it.
        for (slot, key, value) in [
            (0, 9, 90),
            (3, 7, 70),
            (5, 2, 20),
            (26, 7, 71),
            (30, 11, 110),
        ] {
            m.set_entry(slot, key, &u64::to_le_bytes(value));
        }
        let n = Node::<u64>::new(l, &b);
        let (part, held) = leaf_part(&n, 2, 11);
        assert_eq!(held, 5, "every entry the copy held, in range or not");
        let keys: Vec<u64> = part.iter().map(|e| e.0).collect();
        assert_eq!(keys, [2, 7, 9], "{part:?}");
        let seven = part[1];
        assert!(
            [(70, 3), (71, 26)].contains(&(seven.1, seven.2)),
            "{part:?}"
        );
    }
}
