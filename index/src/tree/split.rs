//! Splits: a full leaf becomes two, written with its sibling (in one
//! doorbell when both are on one memory node), and the separator goes into
//! the parent, splitting it in turn when full.

use super::*;

impl<K: TreeKey> TreeClientOf<K> {
    /// Splits a full leaf (read into `buf`) whose new sorted contents are
    /// `entries`. The leaf's copy goes back to the task's scratch before
    /// the halves are written, and so does each internal node's in
    /// `insert_parent` before its own split is: a split that climbs k
    /// levels then holds two nodes of scratch at its peak, not k + 3 (which
    /// ran a slot of `Layout::op_scratch_bytes` out at the fourth level
    /// with 16 KiB nodes).
    pub(super) async fn split_leaf<N: Nic>(
        &mut self,
        ctx: &Ctx<N>,
        held: Held,
        addr: GlobalAddr,
        buf: Buf,
        entries: LeafItems<K>,
    ) -> Result<(), TreeError> {
        let mid = entries.len() / 2;
        let sep = entries.key(mid);
        let (low, high, sibling, version, lock_word) = {
            let n = self.node(buf.as_slice());
            (n.low(), n.high(), n.sibling(), n.version(), n.lock_word())
        };
        let (held, right_addr) = self.alloc_node(ctx, held).await?;
        let nb = self.layout.node_bytes();
        let mut right = vec![0u8; nb];
        let mut r = self.node_mut(&mut right);
        r.init(0, sep, high, sibling, version.wrapping_add(1));
        entries.fill(&mut r, mid..entries.len());
        let mut left = vec![0u8; nb];
        let mut l = self.node_mut(&mut left);
        l.init(0, low, sep, right_addr, version.wrapping_add(1));
        l.set_lock_word(lock_word);
        entries.fill(&mut l, 0..mid);
        drop(buf);
        self.stats.splits += 1;
        self.write_split(ctx, held, addr, &left, right_addr, &right)
            .await?;
        self.insert_parent(ctx, 1, sep, right_addr, addr).await
    }

    /// Writes a split's two halves and unlocks: one doorbell when both are
    /// on one memory node (the sibling lands first: same queue pair), else
    /// the sibling first, then the rewritten node with the unlock.
    pub(super) async fn write_split<N: Nic>(
        &mut self,
        ctx: &Ctx<N>,
        held: Held,
        addr: GlobalAddr,
        left: &[u8],
        right_addr: GlobalAddr,
        right: &[u8],
    ) -> Result<(), TreeError> {
        if right_addr.node() == addr.node() {
            return self
                .write_and_release(ctx, held, &[(right_addr, right), (addr, left)], left)
                .await;
        }
        if let Err(e) = ctx.write(right_addr, right).await {
            self.abandon(ctx, held, true).await;
            return Err(e.into());
        }
        self.write_and_release(ctx, held, &[(addr, left)], left)
            .await
    }

    /// Inserts separator `sep` → `child` into the node at `level` covering
    /// `sep`, splitting upward as needed; `left` is the node that split.
    pub(super) async fn insert_parent<N: Nic>(
        &mut self,
        ctx: &Ctx<N>,
        level: u8,
        sep: K,
        child: GlobalAddr,
        left: GlobalAddr,
    ) -> Result<(), TreeError> {
        let mut hops = 0;
        let mut pending_since = None;
        for _ in 0..MAX_RESTARTS {
            let (root, root_level) = self.root(ctx, true).await?;
            if root_level < level {
                let old = root.raw() | (root_level as u64);
                if root == left {
                    // We split the root: grow the tree.
                    if self.grow_root(ctx, level, sep, child, left, old).await? {
                        return Ok(());
                    }
                    continue;
                }
                // Someone else's root split is still being installed; one
                // not installed within ROOT_HELP_NS may never be (its
                // client's link failed after the split): install it.
                // Timed per root word: a root that moved on since is a
                // new split, given its own ROOT_HELP_NS.
                let now = ctx.now_ns();
                let since = match pending_since {
                    Some((word, t)) if word == old => t,
                    _ => pending_since.insert((old, now)).1,
                };
                if now.saturating_sub(since) >= ROOT_HELP_NS {
                    pending_since = None;
                    self.help_grow_root(ctx, root, root_level, old).await?;
                    continue;
                }
                ctx.yield_now().await;
                continue;
            }
            let mut addr = self.find_level(ctx, sep, level).await?;
            loop {
                let (held, mut buf) = self.lock_and_read(ctx, addr).await?;
                let n = self.node(buf.as_slice());
                if n.level() != level || sep < n.low() {
                    self.write_and_release(ctx, held, &[], buf.as_slice())
                        .await?;
                    self.tree.cache.invalidate_covering(level, sep);
                    break;
                }
                if sep >= n.high() {
                    let s = n.sibling();
                    self.write_and_release(ctx, held, &[], buf.as_slice())
                        .await?;
                    self.hop(&mut hops, addr)?;
                    addr = s;
                    continue;
                }
                let mut kids = n.children();
                if kids.iter().any(|&(k, c)| k == sep && c == child) {
                    self.write_and_release(ctx, held, &[], buf.as_slice())
                        .await?;
                    return Ok(());
                }
                let pos = kids.partition_point(|&(k, _)| k <= sep);
                kids.insert(pos, (sep, child));
                let (low, high, sibling, version) = (n.low(), n.high(), n.sibling(), n.version());
                self.tree.cache.invalidate(level, low);
                if kids.len() - 1 <= n.fanout() {
                    let mut m = self.node_mut(buf.as_mut_slice());
                    fill_internal(&mut m, &kids);
                    m.set_version(version.wrapping_add(1));
                    let data = buf.as_slice().to_vec();
                    self.write_and_release(ctx, held, &[(addr, &data)], &data)
                        .await?;
                    return Ok(());
                }
                // Split the internal node: the middle separator moves up.
                let mid = kids.len() / 2;
                let up = kids[mid].0;
                let (held, right_addr) = self.alloc_node(ctx, held).await?;
                let lock_word = self.node(buf.as_slice()).lock_word();
                let (lbuf, right) = internal_halves(
                    self.layout,
                    Fences {
                        level,
                        low,
                        high,
                        sibling,
                        version: version.wrapping_add(1),
                    },
                    lock_word,
                    &kids,
                    right_addr,
                );
                // Its copy is in the halves now: back to the task's
                // scratch before the level above (`split_leaf`).
                drop(buf);
                self.stats.splits += 1;
                self.write_split(ctx, held, addr, &lbuf, right_addr, &right)
                    .await?;
                return Box::pin(self.insert_parent(ctx, level + 1, up, right_addr, addr)).await;
            }
        }
        Err(TreeError::Corrupt {
            addr: left,
            why: "parent insert restarted without end",
        })
    }

    /// Installs the new root a split of the root at `root` (at level
    /// `root_level`, the root word holding `old`) left uninstalled: over
    /// the root and its sibling, the root's high fence between them, as
    /// the splitter would have. Nothing when the root has no sibling (the
    /// root word moved on, or the split is not written yet). The splitter,
    /// should it come back, finds the root word changed and its separator
    /// in place (one node it allocated is then lost).
    async fn help_grow_root<N: Nic>(
        &mut self,
        ctx: &Ctx<N>,
        root: GlobalAddr,
        root_level: u8,
        old: u64,
    ) -> Result<(), TreeError> {
        let buf = self.read_node(ctx, root).await?;
        let n = self.node(buf.as_slice());
        let (level, high, sibling) = (n.level(), n.high(), n.sibling());
        drop(buf);
        if level != root_level || sibling.is_null() || high == K::INFINITY {
            return Ok(());
        }
        self.stats.root_helps += 1;
        self.grow_root(ctx, root_level + 1, high, sibling, root, old)
            .await
            .map(drop)
    }

    /// Installs a new root at `level` over `left` and its new sibling
    /// `child` (separator `sep`), if the root word still holds `old`;
    /// whether it did.
    async fn grow_root<N: Nic>(
        &mut self,
        ctx: &Ctx<N>,
        level: u8,
        sep: K,
        child: GlobalAddr,
        left: GlobalAddr,
        old: u64,
    ) -> Result<bool, TreeError> {
        let new_root = self.alloc_raw(ctx).await?;
        let mut buf = vec![0u8; self.layout.node_bytes()];
        let mut n = self.node_mut(&mut buf);
        n.init(level, K::MIN, K::INFINITY, GlobalAddr::NULL, 1);
        n.set_leftmost(left);
        n.set_child(0, sep, child);
        n.set_count(1);
        ctx.write(new_root, &buf).await?;
        let new = new_root.raw() | level as u64;
        if ctx.cas(ROOT_WORD, old, new).await? == old {
            self.root_hint = new;
            return Ok(true);
        }
        Ok(false)
    }
}

/// What an internal node that splits keeps and hands on: its level, its
/// fences and sibling, and the halves' version.
struct Fences<K> {
    level: u8,
    low: K,
    high: K,
    sibling: GlobalAddr,
    version: u8,
}

/// The two halves of a full internal node with children `kids`: the left
/// (still locked with `lock_word`, now ending at the middle separator and
/// pointing at the right) and the right (at `right_addr`, from the middle
/// separator to the old high fence and sibling).
fn internal_halves<K: TreeKey>(
    layout: Layout,
    f: Fences<K>,
    lock_word: u64,
    kids: &[(K, GlobalAddr)],
    right_addr: GlobalAddr,
) -> (Vec<u8>, Vec<u8>) {
    let mid = kids.len() / 2;
    let up = kids[mid].0;
    let mut right = vec![0u8; layout.node_bytes()];
    let mut r = NodeMut::<K>::new(layout, &mut right);
    r.init(f.level, up, f.high, f.sibling, f.version);
    fill_internal(&mut r, &kids[mid..]);
    let mut left = vec![0u8; layout.node_bytes()];
    let mut l = NodeMut::<K>::new(layout, &mut left);
    l.init(f.level, f.low, up, right_addr, f.version);
    l.set_lock_word(lock_word);
    fill_internal(&mut l, &kids[..mid]);
    (left, right)
}
