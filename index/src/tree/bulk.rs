//! Bulk load: sorted records into full leaves and the internal levels
//! above them, bottom up, written in large batches; parts can load in
//! parallel.

use super::*;

impl<K: TreeKey> TreeClientOf<K> {
    /// Loads an empty tree from strictly increasing `(key, value)` pairs
    /// with one client: [`bulk_load_part`](Self::bulk_load_part) over
    /// everything, then [`bulk_load_finish`](Self::bulk_load_finish).
    /// `fill` is the entries per leaf (clamped to 1..=the leaf fanout). Returns the
    /// number of records loaded. Fails with [`TreeError::NotCreated`]
    /// before the tree exists, `NotEmpty` if it holds data, `Unsorted` or
    /// `ReservedKey` for bad input, `Alloc` when memory runs out, `Verb`
    /// when a verb fails, `Corrupt` for a broken node.
    pub async fn bulk_load<N: Nic>(
        &mut self,
        ctx: &Ctx<N>,
        items: impl IntoIterator<Item = (K, u64)>,
        fill: usize,
    ) -> Result<u64, TreeError> {
        self.check_empty(ctx).await?;
        let items: Vec<(K, u64)> = items.into_iter().collect();
        let n = items.len() as u64;
        let leaves = self
            .bulk_load_part(ctx, items, K::MIN, K::INFINITY, fill)
            .await?;
        self.bulk_load_finish(ctx, vec![leaves], fill).await?;
        Ok(n)
    }

    /// Counts the records this client's bulk loads write into `counter`
    /// as their leaves land, for a progress display.
    pub fn report_loaded(&mut self, counter: Arc<AtomicU64>) {
        self.loaded = Some(counter);
    }

    pub(super) fn count_loaded(&self, n: u64) {
        if let Some(c) = &self.loaded {
            // Relaxed: a progress figure, read by a display only.
            c.fetch_add(n, Ordering::Relaxed);
        }
    }

    /// The empty root leaf's address and version, or `NotEmpty`.
    pub(super) async fn check_empty<N: Nic>(
        &mut self,
        ctx: &Ctx<N>,
    ) -> Result<(GlobalAddr, u8), TreeError> {
        let (root, level) = self.root(ctx, true).await?;
        if level != 0 {
            return Err(TreeError::NotEmpty);
        }
        let rbuf = self.read_node(ctx, root).await?;
        let n = self.node(rbuf.as_slice());
        if n.entries().next().is_some() {
            return Err(TreeError::NotEmpty);
        }
        Ok((root, n.version()))
    }

    /// One part of a bulk load, run by any client in parallel with others:
    /// writes leaves (filled to `fill` ≤ the leaf fanout, up to 8 per doorbell, fewer
    /// when nodes are over 8 KiB)
    /// for the strictly increasing `items`, all inside `[low, high)`; the
    /// parts of one load must tile the key space in order (the first from
    /// 0, the last to `u64::MAX`). Returns the part's leaves as (low fence,
    /// address) for [`bulk_load_finish`](Self::bulk_load_finish). Nothing
    /// is visible until the finish swings the root. Fails with
    /// [`TreeError::Unsorted`] for keys out of order or outside
    /// `[low, high)` and `ReservedKey` for `u64::MAX`, before anything is
    /// allocated or written; `Alloc` when memory runs out, `Verb` when a
    /// verb fails.
    pub async fn bulk_load_part<N: Nic>(
        &mut self,
        ctx: &Ctx<N>,
        items: Vec<(K, u64)>,
        low: K,
        high: K,
        fill: usize,
    ) -> Result<Vec<(K, GlobalAddr)>, TreeError> {
        let fill = fill.clamp(1, self.layout.leaf_fanout());
        let mut prev: Option<K> = None;
        for &(k, _) in &items {
            check_key(k)?;
            if prev.is_some_and(|p| k <= p) {
                return Err(TreeError::Unsorted {
                    prev: format!("{:?}", prev.unwrap_or(K::MIN)),
                    key: format!("{k:?}"),
                });
            }
            if k < low || k >= high {
                return Err(TreeError::Unsorted {
                    prev: format!("{low:?}"),
                    key: format!("{k:?}"),
                });
            }
            prev = Some(k);
        }
        let groups: Vec<&[(K, u64)]> = if items.is_empty() {
            vec![&items[..]]
        } else {
            items.chunks(fill).collect()
        };
        let mut addrs = Vec::with_capacity(groups.len());
        for _ in 0..groups.len() {
            addrs.push(self.alloc_raw(ctx).await?);
        }
        let mut value = vec![0u8; self.layout.value_bytes()];
        let mut out = Vec::with_capacity(groups.len());
        let mut pending: Vec<(GlobalAddr, Vec<u8>)> = Vec::new();
        let mut pending_items = 0u64;
        for (i, g) in groups.iter().enumerate() {
            let lo = if i == 0 { low } else { g[0].0 };
            let hi = groups.get(i + 1).map_or(high, |nx| nx[0].0);
            let sib = addrs.get(i + 1).copied().unwrap_or(GlobalAddr::NULL);
            let mut buf = vec![0u8; self.layout.node_bytes()];
            let mut m = self.node_mut(&mut buf);
            m.init(0, lo, hi, sib, 1);
            for (j, &(k, v)) in g.iter().enumerate() {
                layout::widen(v, &mut value);
                m.set_entry(j, k, &value);
            }
            out.push((lo, addrs[i]));
            pending.push((addrs[i], buf));
            pending_items += g.len() as u64;
            if pending.len() == self.nodes_per_doorbell() {
                write_nodes(ctx, &mut pending).await?;
                self.count_loaded(std::mem::take(&mut pending_items));
            }
        }
        write_nodes(ctx, &mut pending).await?;
        self.count_loaded(pending_items);
        Ok(out)
    }

    /// Finishes a bulk load: links each part's last leaf to the next part's
    /// first, builds the internal levels, writes the top node at the old
    /// (empty) root's address — so a client still holding that address
    /// finds a node of another level there and rereads the root word — and
    /// swings the root word. An internal node is filled as the leaves
    /// are: `fill + 1` children where it holds as many entries as a leaf,
    /// in proportion where it holds more (wide values). Lookups and scans
    /// may run meanwhile (they find the empty tree, then the loaded one:
    /// the node written over the root carries a new version, so a copy
    /// caught mid-write reads again); writes may not: a put that lands in
    /// the empty root after the finish checked it is written over. Fails
    /// with [`TreeError::NotEmpty`] if the tree has data (or another load
    /// finished first), `NotCreated` before the tree exists, `Alloc` when
    /// memory runs out, `Verb` when a verb fails, `Corrupt` for a broken
    /// node.
    pub async fn bulk_load_finish<N: Nic>(
        &mut self,
        ctx: &Ctx<N>,
        parts: Vec<Vec<(K, GlobalAddr)>>,
        fill: usize,
    ) -> Result<(), TreeError> {
        let fill = fill.clamp(1, self.layout.leaf_fanout());
        let (root, old_version) = self.check_empty(ctx).await?;
        // The node written over the old root carries the next version: a
        // reader's READ of the root that overlaps the WRITE then holds
        // lines of two versions and reads again, where equal versions let
        // a copy of old and new lines pass as a node (a leaf holding the
        // new node's children as values, or a node of zeroed children).
        let top_version = old_version.wrapping_add(1);
        let parts: Vec<Vec<(K, GlobalAddr)>> =
            parts.into_iter().filter(|p| !p.is_empty()).collect();
        if parts.is_empty() {
            return Ok(());
        }
        let mut b = ctx.batch();
        for w in parts.windows(2) {
            let last = w[0].last().expect("non-empty").1;
            b.write_u64(last.add(layout::OFF_SIBLING as u64), w[1][0].1.raw());
        }
        b.submit().await?;
        let mut level_nodes: Vec<(K, GlobalAddr)> = parts.into_iter().flatten().collect();
        if level_nodes.len() == 1 {
            // A single leaf: copy it to the root's address.
            let mut buf = self.read_node(ctx, level_nodes[0].1).await?;
            self.node_mut(buf.as_mut_slice()).set_version(top_version);
            ctx.write(root, buf.as_slice()).await?;
            return Ok(());
        }
        let mut level = 0u8;
        let mut pending: Vec<(GlobalAddr, Vec<u8>)> = Vec::new();
        while level_nodes.len() > 1 {
            level += 1;
            // As full as the leaves: `fill + 1` children where internal
            // nodes hold as many entries as leaves (8-byte values), more
            // where they hold more.
            let (lf, inf) = (self.layout.leaf_fanout(), self.layout.internal_fanout());
            let per = (inf * fill / lf + 1).clamp(2, inf);
            let chunks: Vec<Vec<(K, GlobalAddr)>> =
                level_nodes.chunks(per).map(|c| c.to_vec()).collect();
            let addrs = self.node_addrs(ctx, chunks.len(), root).await?;
            let mut next = Vec::with_capacity(chunks.len());
            for (i, c) in chunks.iter().enumerate() {
                let low = if i == 0 { K::MIN } else { c[0].0 };
                let high = chunks.get(i + 1).map_or(K::INFINITY, |nx| nx[0].0);
                let sib = addrs.get(i + 1).copied().unwrap_or(GlobalAddr::NULL);
                let mut buf = vec![0u8; self.layout.node_bytes()];
                let mut m = self.node_mut(&mut buf);
                let version = if addrs[i] == root { top_version } else { 1 };
                m.init(level, low, high, sib, version);
                let mut kids = c.clone();
                kids[0].0 = low;
                fill_internal(&mut m, &kids);
                next.push((low, addrs[i]));
                pending.push((addrs[i], buf));
                if pending.len() == self.nodes_per_doorbell() {
                    write_nodes(ctx, &mut pending).await?;
                }
            }
            write_nodes(ctx, &mut pending).await?;
            level_nodes = next;
        }
        debug_assert_eq!(level_nodes[0].1, root);
        let new_root = root.raw() | level as u64;
        let old = root.raw();
        if ctx.cas(ROOT_WORD, old, new_root).await? != old {
            return Err(TreeError::NotEmpty);
        }
        self.root_hint = new_root;
        Ok(())
    }
}

impl<K: TreeKey> TreeClientOf<K> {
    /// Nodes a bulk load writes per doorbell: 8, fewer when they are large
    /// (at most 64 KiB of a task's scratch).
    fn nodes_per_doorbell(&self) -> usize {
        ((64 << 10) / self.layout.node_bytes()).clamp(1, 8)
    }

    /// Addresses for `n` new nodes of one bulk-load level: the old root's
    /// when the level has a single node (the new top), fresh ones otherwise.
    async fn node_addrs<N: Nic>(
        &mut self,
        ctx: &Ctx<N>,
        n: usize,
        root: GlobalAddr,
    ) -> Result<Vec<GlobalAddr>, TreeError> {
        if n == 1 {
            return Ok(vec![root]);
        }
        let mut v = Vec::with_capacity(n);
        for _ in 0..n {
            v.push(self.alloc_raw(ctx).await?);
        }
        Ok(v)
    }
}

pub(super) async fn write_nodes<N: Nic>(
    ctx: &Ctx<N>,
    pending: &mut Vec<(GlobalAddr, Vec<u8>)>,
) -> Result<(), TreeError> {
    if pending.is_empty() {
        return Ok(());
    }
    let mut b = ctx.batch();
    for (a, buf) in pending.iter() {
        b.write_bytes(*a, buf);
    }
    b.submit().await?;
    pending.clear();
    Ok(())
}
