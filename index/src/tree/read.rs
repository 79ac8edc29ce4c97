//! The read path: reading a node until its line versions agree, walking
//! down (through the index cache when it holds the route) to a level, and
//! lookups.

use super::*;
use std::future::Future;

impl<K: TreeKey> TreeClientOf<K> {
    /// Reads a node until it is consistent under the configured scheme.
    ///
    /// This and [`Self::read_node_into`] are plain functions handing out
    /// [`Self::read_node_with`]'s future, not `async fn`s awaiting it: every
    /// nested `async fn` is a state machine of its own, resumed on each
    /// poll and copied into its caller's, and a lookup awaited three.
    pub(super) fn read_node<'a, N: Nic>(
        &'a mut self,
        ctx: &'a Ctx<N>,
        addr: GlobalAddr,
    ) -> impl Future<Output = Result<Buf, TreeError>> + 'a {
        self.read_node_with(ctx, addr, None)
    }

    /// [`Self::read_node`] into `buf`, a node's worth of scratch.
    pub(super) fn read_node_into<'a, N: Nic>(
        &'a mut self,
        ctx: &'a Ctx<N>,
        addr: GlobalAddr,
        buf: Buf,
    ) -> impl Future<Output = Result<Buf, TreeError>> + 'a {
        self.read_node_with(ctx, addr, Some(buf))
    }

    /// [`Self::read_node`] into `buf`, or into a fresh buffer when `None`.
    pub(super) async fn read_node_with<N: Nic>(
        &mut self,
        ctx: &Ctx<N>,
        addr: GlobalAddr,
        buf: Option<Buf>,
    ) -> Result<Buf, TreeError> {
        check_node_addr(addr)?;
        let mut buf = match buf {
            Some(b) => b,
            None => ctx.alloc_for_read(self.layout.node_bytes())?,
        };
        for _ in 0..MAX_READ_RETRIES {
            buf = ctx.read_into(addr, buf).await?;
            if self.check_node(addr, &buf)? {
                return Ok(buf);
            }
            self.stats.read_retries += 1;
        }
        Err(TreeError::Corrupt {
            addr,
            why: "never reads consistently",
        })
    }

    /// Whether a copy of the node at `addr` is consistent under the
    /// configured scheme (false: torn, read it again); a consistent copy
    /// that is not a tree node is an error.
    pub(super) fn check_node(&self, addr: GlobalAddr, buf: &Buf) -> Result<bool, TreeError> {
        let n = self.node(buf.as_slice());
        let consistent = match self.tree.cfg.versions {
            VersionScheme::Lines => n.lines_agree(),
            VersionScheme::FrontRear => n.front_rear_agree(),
        };
        if !consistent {
            return Ok(false);
        }
        if !n.is_valid() {
            return Err(TreeError::Corrupt {
                addr,
                why: "not a tree node",
            });
        }
        if n.low() >= n.high() || n.count() > n.fanout() {
            return Err(TreeError::Corrupt {
                addr,
                why: "impossible fences or count",
            });
        }
        Ok(true)
    }

    /// The node at `level` covering `key`, from the cache or by descending
    /// from the root (caching internal nodes on the way).
    pub(super) async fn find_level<N: Nic>(
        &mut self,
        ctx: &Ctx<N>,
        key: K,
        level: u8,
    ) -> Result<GlobalAddr, TreeError> {
        match self.cached_child(key, level) {
            Some(a) => Ok(a),
            None => self.descend(ctx, key, level).await,
        }
    }

    /// The node at `level` covering `key` by the index cache alone, when
    /// it holds that node's parent (a hit, counted at level 0).
    fn cached_child(&mut self, key: K, level: u8) -> Option<GlobalAddr> {
        let r = self.tree.cache.route(key, level + 1, u8::MAX)?;
        if r.level != level + 1 {
            return None;
        }
        if level == 0 {
            self.stats.cache_hits += 1;
        }
        Some(r.child)
    }

    /// [`Self::find_level`] past a cache miss: from the root, or from the
    /// deepest cached node above `level`.
    async fn descend<N: Nic>(
        &mut self,
        ctx: &Ctx<N>,
        key: K,
        level: u8,
    ) -> Result<GlobalAddr, TreeError> {
        if level == 0 {
            self.stats.cache_misses += 1;
        }
        let mut fresh = false;
        let mut hops = 0;
        'restart: for _ in 0..MAX_RESTARTS {
            let (mut addr, mut at) = self.root(ctx, fresh).await?;
            fresh = true;
            if let Some(r) = self.tree.cache.route(key, level + 1, at) {
                addr = r.child;
                at = r.level - 1;
            }
            if at < level {
                // The tree is shorter than asked (a root split in progress).
                ctx.yield_now().await;
                continue 'restart;
            }
            loop {
                if at == level {
                    return Ok(addr);
                }
                let buf = self.read_node(ctx, addr).await?;
                let n = self.node(buf.as_slice());
                if n.level() != at || key < n.low() {
                    self.tree.cache.invalidate_covering(at, key);
                    continue 'restart;
                }
                if key >= n.high() {
                    let sibling = self.sibling_of(&n, addr)?;
                    self.hop(&mut hops, addr)?;
                    addr = sibling;
                    continue;
                }
                self.tree.cache.insert(addr, &n);
                addr = n.child_for(key);
                at -= 1;
            }
        }
        Err(TreeError::Corrupt {
            addr: ROOT_WORD,
            why: "descent restarted without end",
        })
    }

    /// Counts a step from the node at `from` to its sibling against the
    /// operation's `hops`: past [`MAX_SIBLING_HOPS`] the chain is corrupt.
    pub(super) fn hop(&mut self, hops: &mut u32, from: GlobalAddr) -> Result<(), TreeError> {
        self.stats.sibling_hops += 1;
        *hops += 1;
        if *hops > MAX_SIBLING_HOPS {
            return Err(TreeError::Corrupt {
                addr: from,
                why: "sibling chain without end",
            });
        }
        Ok(())
    }

    /// The value of `key`, if present. Fails with
    /// [`TreeError::ReservedKey`] for the largest key, `NotCreated` before the
    /// tree exists, `Verb` when a verb fails, `Corrupt` for a broken node
    /// or endless restarts.
    /// With values wider than 8 bytes, the value's first eight bytes as a
    /// little-endian `u64` ([`Self::get_value`] gives all of it).
    pub async fn get<N: Nic>(&mut self, ctx: &Ctx<N>, key: K) -> Result<Option<u64>, TreeError> {
        crate::scratch_scoped!(ctx, self.get_unscoped(ctx, key, None))
    }

    /// The whole value of `key` (the tree's `value_bytes`) into `out`, if
    /// present; whether it was. Fails as [`Self::get`] does, and with
    /// [`TreeError::ValueSize`] when `out` is not `value_bytes` long.
    pub async fn get_value<N: Nic>(
        &mut self,
        ctx: &Ctx<N>,
        key: K,
        out: &mut [u8],
    ) -> Result<bool, TreeError> {
        self.check_value_size(out.len())?;
        let r = crate::scratch_scoped!(ctx, self.get_unscoped(ctx, key, Some(out)));
        r.map(|v| v.is_some())
    }

    /// A lookup; the whole value goes to `out` when given.
    pub(super) async fn get_unscoped<N: Nic>(
        &mut self,
        ctx: &Ctx<N>,
        key: K,
        out: Option<&mut [u8]>,
    ) -> Result<Option<u64>, TreeError> {
        check_key(key)?;
        // Checked here, not in an awaited call: the lookup polls no
        // nested future while nothing is stranded.
        if self.tree.has_stranded() {
            self.release_stranded(ctx, false).await;
        }
        self.stats.lookups += 1;
        let retries0 = self.stats.read_retries;
        // A cache hit is the common case: settled here, with no descent's
        // future to make and await.
        let mut addr = match self.cached_child(key, 0) {
            Some(a) => a,
            None => self.descend(ctx, key, 0).await?,
        };
        let mut clean = true;
        for _ in 0..MAX_RESTARTS {
            let buf = self.read_node(ctx, addr).await?;
            let n = self.node(buf.as_slice());
            if !n.is_leaf() || key < n.low() {
                self.tree.cache.invalidate_covering(1, key);
                self.root_hint = 0;
                clean = false;
                addr = self.find_level(ctx, key, 0).await?;
                continue;
            }
            if key >= n.high() {
                self.stats.sibling_hops += 1;
                self.tree.cache.invalidate_covering(1, key);
                clean = false;
                addr = n.sibling();
                continue;
            }
            if clean && self.stats.read_retries == retries0 {
                self.stats.clean_lookups += 1;
            }
            let slot = n.find(key);
            if let (Some(i), Some(out)) = (slot, out) {
                n.value_into(i, out);
            }
            return Ok(slot.map(|i| n.value(i)));
        }
        Err(TreeError::Corrupt {
            addr,
            why: "lookup restarted without end",
        })
    }

    /// The right sibling of node `n` (at `addr`), for a key at or past its
    /// high fence: a consistent node that ends short of the key space has
    /// one, so a null one is corrupt (for a descent, the key lies beyond
    /// the last node; for a scan, it ended short, or went back to the
    /// root without end).
    pub(super) fn sibling_of(
        &self,
        n: &Node<'_, K>,
        addr: GlobalAddr,
    ) -> Result<GlobalAddr, TreeError> {
        match n.sibling() {
            s if s.is_null() => Err(TreeError::Corrupt {
                addr,
                why: "key beyond the last node",
            }),
            s => Ok(s),
        }
    }
}

impl<K: TreeKey> TreeClientOf<K> {
    /// A value buffer must be the tree's `value_bytes` long.
    pub(super) fn check_value_size(&self, len: usize) -> Result<(), TreeError> {
        if len != self.layout.value_bytes() {
            return Err(TreeError::ValueSize {
                expected: self.layout.value_bytes(),
                got: len,
            });
        }
        Ok(())
    }
}

/// A node pointer must be non-null and aligned as nodes are (1 KiB,
/// whatever their size).
pub(super) fn check_node_addr(addr: GlobalAddr) -> Result<(), TreeError> {
    if addr.is_null() || !addr.offset().is_multiple_of(layout::NODE_ALIGN) {
        return Err(TreeError::Corrupt {
            addr,
            why: "pointer is null or not node-aligned",
        });
    }
    Ok(())
}
