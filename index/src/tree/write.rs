//! Locking and write-back: taking a node's HOCL lock, giving it up, and
//! writing a changed node back with the unlock (command combination); put
//! and delete, which change a leaf in place or split it.
//!
//! # Stranded locks
//! Sherman's locks have no leases: a lock word stays taken until its
//! holder writes it back to 0. When a verb fails with the link to the
//! lock's memory node cut, the holder's release may not land, or its
//! acquiring CAS may have taken with its answer lost; before, such a word
//! stayed taken for good, and every later writer of the nodes it guards,
//! on every compute node, failed with `LockWait`. Such a word is now
//! *stranded*: recorded in the tree handle with what it holds (`taker`,
//! the id of the client whose CAS took it), and released by CAS from
//! `taker` to 0 at the start of a later operation of one of the compute
//! node's clients (`release_stranded`), or when one that sits idle calls
//! [`TreeClientOf::release_while_idle`], in the turn of the word's local
//! entry; a failed release stays recorded. Sound because a client id is
//! used on one compute node only ([`TreeOf::client`]), so only this
//! compute node's clients ever put `taker` in the word, and they take it,
//! or get it handed over, only in the entry's turn: in that turn, with no
//! handover, the word holding `taker` is held by nobody. A handover found
//! there (the word taken again since and handed on) is released as its
//! holder would. Without a local table (FG+), only the taker releases
//! its word, between its operations, when it holds no lock.

use super::*;

impl<K: TreeKey> TreeClientOf<K> {
    /// Waits for its turn at `node`'s lock in the local lock table, if
    /// there is one; the lock, and `Some` when the previous local holder
    /// handed it over (held already: no remote CAS), with the page it
    /// left, if any.
    async fn queue<N: Nic>(
        &mut self,
        ctx: &Ctx<N>,
        node: GlobalAddr,
    ) -> Result<(Held, Option<Option<Page>>), TreeError> {
        self.queue_at(ctx, self.tree.lock_of(node), node).await
    }

    /// [`Self::queue`] for the lock `lock` of the node at `node`.
    async fn queue_at<N: Nic>(
        &mut self,
        ctx: &Ctx<N>,
        lock: LockRef,
        node: GlobalAddr,
    ) -> Result<(Held, Option<Option<Page>>), TreeError> {
        if !self.tree.cfg.local_lock_table {
            let held = Held {
                lock,
                taker: self.id,
                local: None,
                node,
            };
            return Ok((held, None));
        }
        let locks = &self.tree.locks;
        let turn = if self.tree.cfg.local_wait_queue {
            let t = locks.ticket(lock.local);
            while !locks.is_turn(lock.local, t) {
                ctx.yield_now().await;
            }
            Turn::Ticket(t)
        } else {
            while !locks.try_take(lock.local) {
                ctx.yield_now().await;
            }
            Turn::Taken
        };
        self.in_turn(ctx, lock, node, turn).await
    }

    /// Entry `lock.local`'s turn now, if nobody holds or waits for it
    /// (with a local table): a turn taken without waiting.
    fn turn_now(&self, lock: LockRef) -> Option<Turn> {
        let locks = &self.tree.locks;
        if self.tree.cfg.local_wait_queue {
            locks.try_ticket(lock.local).map(Turn::Ticket)
        } else {
            locks.try_take(lock.local).then_some(Turn::Taken)
        }
    }

    /// [`Self::queue_at`] once `turn` at `lock`'s local entry is this
    /// client's.
    async fn in_turn<N: Nic>(
        &mut self,
        ctx: &Ctx<N>,
        lock: LockRef,
        node: GlobalAddr,
        turn: Turn,
    ) -> Result<(Held, Option<Option<Page>>), TreeError> {
        let locks = &self.tree.locks;
        let mut held = Held {
            lock,
            taker: self.id,
            local: Some(turn),
            node,
        };
        match locks.on_turn(lock.local, lock.word) {
            Local::HandedOver(page, taker) => {
                self.stats.handovers += 1;
                held.taker = taker;
                Ok((held, Some(page)))
            }
            Local::MustAcquire => Ok((held, None)),
            Local::ReleaseFirst(other, taker) => {
                // The previous holder finished its writes before passing
                // the entry on, so releasing its word now is safe.
                if let Err(e) = ctx.write(other, &0u64.to_le_bytes()).await {
                    let other = LockRef {
                        word: other,
                        ..lock
                    };
                    self.strand(other, taker);
                    self.abandon(ctx, held, false).await;
                    return Err(e.into());
                }
                Ok((held, None))
            }
        }
    }

    /// Records that `lock` may be left taken, holding `taker` ("Stranded
    /// locks" above).
    fn strand(&mut self, lock: LockRef, taker: u64) {
        self.stats.locks_stranded += 1;
        self.tree.add_stranded(Stranded { lock, taker });
    }

    /// Releases the lock words this compute node's clients stranded
    /// ("Stranded locks" above), each by CAS from what it holds to 0 in
    /// its local entry's turn; without a local table, only those this
    /// client stranded. One whose verb fails again stays stranded. At the
    /// start of each operation, when [`TreeOf::has_stranded`]. Unless
    /// `wait`, only the words whose entry's turn comes at once: lookups
    /// and scans wait for no lock, so they leave a word whose entry a
    /// writer holds (or waits for) to a later operation.
    pub(super) async fn release_stranded<N: Nic>(&mut self, ctx: &Ctx<N>, wait: bool) {
        // Without a local table only the taker itself may: nothing orders
        // it with another client's release.
        let (me, anyone) = (self.id, self.tree.cfg.local_lock_table);
        let todo: Vec<Stranded> = self.tree.change_stranded(|s| {
            s.iter()
                .filter(|x| anyone || x.taker == me)
                .copied()
                .collect()
        });
        for x in todo {
            self.release_one(ctx, x, wait).await;
        }
    }

    /// For a client with no operation to run: releases the lock words
    /// this compute node's clients stranded ("Stranded locks" above), as
    /// the start of its next operation would; whether any stays stranded
    /// (its release failed again: call it again later; or, without a
    /// local table, another client stranded it, and only that client
    /// releases it). A stranded word
    /// is otherwise released only when one of the node's clients runs an
    /// operation, and until then every other compute node's writer of
    /// the nodes it guards waits and fails with `LockWait`: a compute node
    /// whose clients may sit idle calls this now and then (one load while
    /// nothing is stranded). Call it between operations, holding no
    /// [`NodeLock`]: a release waits for its word's local entry, which a
    /// lock this client holds may share.
    pub async fn release_while_idle<N: Nic>(&mut self, ctx: &Ctx<N>) -> bool {
        if self.tree.has_stranded() {
            self.release_stranded(ctx, true).await;
        }
        self.tree.has_stranded()
    }

    /// Releases the stranded word `x` in its local entry's turn, unless
    /// another client did first (a local waiter takes a stranded word
    /// over: `acquire_with`). Left stranded if its verb fails again, or,
    /// unless `wait`, if the turn does not come at once.
    async fn release_one<N: Nic>(&mut self, ctx: &Ctx<N>, x: Stranded, wait: bool) {
        // No node: nothing is read under this lock, and a handover leaves
        // no page for it.
        let none = GlobalAddr::NULL;
        let queued = if wait || !self.tree.cfg.local_lock_table {
            self.queue_at(ctx, x.lock, none).await
        } else if let Some(turn) = self.turn_now(x.lock) {
            self.in_turn(ctx, x.lock, none, turn).await
        } else {
            return;
        };
        let Ok((held, handed)) = queued else {
            return;
        };
        let mine = self.tree.unstrand(x.lock.word, x.taker);
        if handed.is_some() {
            // A local client took the word again since (the release did
            // land) and handed it on: held now, released as holders do.
            let _ = self.write_and_release(ctx, held, &[], &[]).await;
            return;
        }
        // In the entry's turn (or, without a local table, between this
        // client's operations): nobody holds the word on `taker`'s behalf.
        if mine {
            match ctx.cas(x.lock.word, x.taker, 0).await {
                Ok(old) if old == x.taker => self.stats.stranded_released += 1,
                // Released after all (the lost release had landed).
                Ok(_) => {}
                Err(_) => self.tree.add_stranded(x),
            }
        }
        self.abandon(ctx, held, false).await;
    }

    /// Takes the global lock of `held` by CAS, retrying while it is taken.
    async fn acquire<N: Nic>(&mut self, ctx: &Ctx<N>, held: Held) -> Result<Held, TreeError> {
        Ok(self.acquire_with(ctx, held, None).await?.0)
    }

    /// Takes the global lock of `held` and reads its node in one doorbell
    /// per try: the CAS and the READ go to the node's memory node on one
    /// queue pair, where they execute in order, so the READ of a won CAS
    /// sees the node as its last holder left it (that holder's writes
    /// landed before its unlock, on its own queue pair). A lost CAS's
    /// READ is dropped.
    async fn acquire_reading<N: Nic>(
        &mut self,
        ctx: &Ctx<N>,
        held: Held,
    ) -> Result<(Held, Buf), TreeError> {
        let node = held.node;
        let nb = self.layout.node_bytes();
        // `node` was checked by `lock_and_read`, before its lock.
        let buf = match ctx.alloc(nb) {
            Ok(b) => b,
            Err(e) => {
                self.abandon(ctx, held, false).await;
                return Err(e.into());
            }
        };
        let (held, buf) = self.acquire_with(ctx, held, Some(buf)).await?;
        let buf = buf.expect("a READ rode with every CAS");
        match self.check_node(node, &buf) {
            Ok(true) => Ok((held, buf)),
            // Torn under the lock cannot happen while every writer holds
            // it; read again rather than trust that.
            Ok(false) => self.read_held(ctx, held, Some(buf)).await,
            Err(e) => {
                self.abandon(ctx, held, true).await;
                Err(e)
            }
        }
    }

    /// The CAS loop of [`Self::acquire`], with `buf` (if any) read from
    /// the locked node in each try's doorbell and returned from the try
    /// that won. A failed verb gives the lock up and is the error; so is a
    /// lock still taken `lock_wait_ns` after the first try found it taken
    /// ([`TreeError::LockWait`]).
    async fn acquire_with<N: Nic>(
        &mut self,
        ctx: &Ctx<N>,
        held: Held,
        mut buf: Option<Buf>,
    ) -> Result<(Held, Option<Buf>), TreeError> {
        let mut since = None;
        // What the CAS expects: 0, or a stranded word's holder to take it
        // over from ("Stranded locks" above).
        let mut expect = 0;
        loop {
            let mut b = ctx.batch();
            let cas = b.cas(held.lock.word, expect, self.id);
            let rd = buf.take().map(|x| b.read(held.node, x));
            match b.submit().await {
                Ok(mut done) => {
                    let holder = done.old(cas);
                    buf = rd.map(|op| done.take_buf(op));
                    drop(done);
                    if holder == expect {
                        if expect != 0 {
                            self.stats.stranded_released += 1;
                        }
                        break;
                    }
                    // In the local entry's turn, a word this compute node
                    // stranded is nobody's: take it over.
                    expect = 0;
                    if held.local.is_some() && self.tree.unstrand(held.lock.word, holder) {
                        expect = holder;
                        continue;
                    }
                    self.stats.lock_retries += 1;
                    let now = ctx.now_ns();
                    let first = *since.get_or_insert(now);
                    if now.saturating_sub(first) >= self.tree.cfg.lock_wait_ns {
                        let word = held.lock.word;
                        self.abandon(ctx, held, false).await;
                        return Err(TreeError::LockWait {
                            word,
                            holder,
                            waited_ns: now - first,
                        });
                    }
                    ctx.yield_now().await;
                }
                Err(e) => {
                    // The CAS may have taken, its answer lost.
                    self.strand(held.lock, self.id);
                    if expect != 0 {
                        self.strand(held.lock, expect);
                    }
                    self.abandon(ctx, held, false).await;
                    return Err(e.into());
                }
            }
        }
        let held = Held {
            taker: self.id,
            ..held
        };
        if held.local.is_some() {
            self.tree
                .locks
                .set_remote_held(held.lock.local, held.lock.word, self.id);
        }
        Ok((held, buf))
    }

    /// Locks the node at `addr` and reads it under the lock: a lock
    /// handed over with the node's page reads nothing; with
    /// `lock_with_read` the CAS and the READ share a doorbell; else the
    /// CAS, then the READ. A failed read gives the lock up (the node is
    /// unchanged) and is the error.
    pub(super) async fn lock_and_read<N: Nic>(
        &mut self,
        ctx: &Ctx<N>,
        addr: GlobalAddr,
    ) -> Result<(Held, Buf), TreeError> {
        // A pointer read from a node (a sibling, a child) is checked
        // before its lock is: a null one names a lock word that is not a
        // node's (on FG+, inside the superblock).
        check_node_addr(addr)?;
        let (held, handed) = self.queue(ctx, addr).await?;
        let cfg = &self.tree.cfg;
        if let (Some(page), true) = (&handed, cfg.handover_page) {
            let mut buf = match ctx.alloc(self.layout.node_bytes()) {
                Ok(b) => b,
                Err(e) => {
                    self.abandon(ctx, held, true).await;
                    return Err(e.into());
                }
            };
            if page
                .as_ref()
                .is_some_and(|p| p.copy_to(addr, buf.as_mut_slice()))
            {
                self.stats.pages_handed_over += 1;
                return Ok((held, buf));
            }
            // Another node's page, or none: the buffer takes the READ.
            return self.read_held(ctx, held, Some(buf)).await;
        }
        let held = if handed.is_some() {
            held
        } else if cfg.lock_with_read {
            return self.acquire_reading(ctx, held).await;
        } else {
            self.acquire(ctx, held).await?
        };
        self.read_held(ctx, held, None).await
    }

    /// Reads the node of a lock held (into `buf`, else fresh scratch); a
    /// failed read gives the lock up.
    async fn read_held<N: Nic>(
        &mut self,
        ctx: &Ctx<N>,
        held: Held,
        buf: Option<Buf>,
    ) -> Result<(Held, Buf), TreeError> {
        let read = self.read_node_with(ctx, held.node, buf).await;
        match read {
            Ok(b) => Ok((held, b)),
            Err(e) => {
                self.abandon(ctx, held, true).await;
                Err(e)
            }
        }
    }

    /// Takes the lock of the node at `node` as a write does (its turn in
    /// the local lock table, a handover, or the remote CAS until it wins)
    /// without reading the node: the lock microbenchmark's acquisition
    /// (`loch-bench locks`). Release it with [`Self::unlock_node`]
    /// before taking another: two nodes' locks may share a local entry,
    /// whose turn this client would then wait for behind itself.
    pub async fn lock_node<N: Nic>(
        &mut self,
        ctx: &Ctx<N>,
        node: GlobalAddr,
    ) -> Result<NodeLock, TreeError> {
        check_node_addr(node)?;
        if self.tree.has_stranded() {
            self.release_stranded(ctx, true).await;
        }
        let (held, handed) = self.queue(ctx, node).await?;
        let held = if handed.is_some() {
            held
        } else {
            self.acquire(ctx, held).await?
        };
        Ok(NodeLock(held))
    }

    /// Releases a lock [`Self::lock_node`] took, writing nothing: to the
    /// next local waiter (handover) or by the remote unlock.
    pub async fn unlock_node<N: Nic>(
        &mut self,
        ctx: &Ctx<N>,
        lock: NodeLock,
    ) -> Result<(), TreeError> {
        self.write_and_release(ctx, lock.0, &[], &[]).await
    }

    /// Allocates a node for a split while `held` is held; a failed
    /// allocation gives the lock up (nothing was written yet) and is the
    /// error.
    pub(super) async fn alloc_node<N: Nic>(
        &mut self,
        ctx: &Ctx<N>,
        held: Held,
    ) -> Result<(Held, GlobalAddr), TreeError> {
        match self.alloc_raw(ctx).await {
            Ok(a) => Ok((held, a)),
            Err(e) => {
                self.abandon(ctx, held, true).await;
                Err(e)
            }
        }
    }

    /// Gives a lock up after a failure: lets the local queue go on and, if
    /// we took the global lock, tries to release it (best effort: the node
    /// may be dead).
    pub(super) async fn abandon<N: Nic>(&mut self, ctx: &Ctx<N>, held: Held, remote: bool) {
        if remote
            && ctx
                .write(held.lock.word, &0u64.to_le_bytes())
                .await
                .is_err()
        {
            self.strand(held.lock, held.taker);
        }
        if let Some(t) = held.local {
            let locks = &self.tree.locks;
            let _ = locks.plan_release(held.lock.local, t, 0, false);
            locks.pass(held.lock.local, t);
        }
    }

    /// Writes `writes` (in order, on their nodes' queue pairs) and releases
    /// the lock: in the same doorbell when combining, else in a second
    /// round trip; or hands it to a local waiter, with `page` — the locked
    /// node's bytes once the writes land; empty: none — when pages go with
    /// the lock.
    pub(super) async fn write_and_release<N: Nic>(
        &mut self,
        ctx: &Ctx<N>,
        held: Held,
        writes: &[(GlobalAddr, &[u8])],
        page: &[u8],
    ) -> Result<(), TreeError> {
        let cfg = self.tree.cfg.clone();
        let hand_over = match held.local {
            Some(t) => {
                self.tree
                    .locks
                    .plan_release(held.lock.local, t, cfg.max_handover, cfg.handover)
            }
            None => false,
        };
        let mut b = ctx.batch();
        for (addr, data) in writes {
            b.write_bytes(*addr, data);
        }
        let unlock_now = !hand_over && cfg.combine;
        if unlock_now {
            b.write_u64(held.lock.word, 0);
        }
        let r = if b.is_empty() {
            Ok(())
        } else {
            b.submit().await.map(drop)
        };
        let r = match r {
            Ok(()) if !hand_over && !unlock_now => {
                ctx.write(held.lock.word, &0u64.to_le_bytes()).await
            }
            other => other,
        };
        // Released remotely (or meant to be, the writes before failing):
        // the unlock may not have landed.
        if r.is_err() && !hand_over {
            self.strand(held.lock, held.taker);
        }
        if let Some(t) = held.local {
            if hand_over && cfg.handover_page {
                // A failed write leaves the node unknown: no page.
                let page = (r.is_ok() && !page.is_empty()).then_some((held.node, page));
                self.tree.locks.leave_page(held.lock.local, page);
            }
            self.tree.locks.pass(held.lock.local, t);
        }
        r.map_err(Into::into)
    }

    /// Inserts `key` or replaces its value; splits the leaf (and its
    /// parents) when full. With values wider than 8 bytes the value stored
    /// is `value`'s eight little-endian bytes repeated ([`layout::widen`];
    /// [`Self::put_value`] stores any bytes). Fails with
    /// [`TreeError::ReservedKey`] for the largest key, `NotCreated` before the
    /// tree exists, `Alloc` when a split finds no memory for a new node,
    /// `Verb` when a verb fails, `Corrupt` for a broken node or endless
    /// restarts.
    pub async fn put<N: Nic>(&mut self, ctx: &Ctx<N>, key: K, value: u64) -> Result<(), TreeError> {
        let vb = self.layout.value_bytes();
        let (small, wide);
        let v: &[u8] = if vb == 8 {
            small = value.to_le_bytes();
            &small
        } else {
            let mut w = vec![0u8; vb];
            layout::widen(value, &mut w);
            wide = w;
            &wide
        };
        crate::scratch_scoped!(ctx, self.put_unscoped(ctx, key, v))
    }

    /// [`Self::put`] of a whole value, `value_bytes` long; fails also with
    /// [`TreeError::ValueSize`] for a value of another length.
    pub async fn put_value<N: Nic>(
        &mut self,
        ctx: &Ctx<N>,
        key: K,
        value: &[u8],
    ) -> Result<(), TreeError> {
        self.check_value_size(value.len())?;
        crate::scratch_scoped!(ctx, self.put_unscoped(ctx, key, value))
    }

    pub(super) async fn put_unscoped<N: Nic>(
        &mut self,
        ctx: &Ctx<N>,
        key: K,
        value: &[u8],
    ) -> Result<(), TreeError> {
        check_key(key)?;
        self.modify(ctx, key, Some(value)).await.map(drop)
    }

    /// Removes `key`; returns whether it was present. The leaf stays in
    /// place however empty it gets. Fails with [`TreeError::ReservedKey`]
    /// for the largest key, `NotCreated` before the tree exists, `Verb` when a
    /// verb fails, `Corrupt` for a broken node or endless restarts.
    pub async fn delete<N: Nic>(&mut self, ctx: &Ctx<N>, key: K) -> Result<bool, TreeError> {
        crate::scratch_scoped!(ctx, self.delete_unscoped(ctx, key))
    }

    pub(super) async fn delete_unscoped<N: Nic>(
        &mut self,
        ctx: &Ctx<N>,
        key: K,
    ) -> Result<bool, TreeError> {
        check_key(key)?;
        self.modify(ctx, key, None).await
    }

    /// Put (`Some`) or delete (`None`) under the leaf's lock. Returns
    /// whether the key was present before.
    pub(super) async fn modify<N: Nic>(
        &mut self,
        ctx: &Ctx<N>,
        key: K,
        value: Option<&[u8]>,
    ) -> Result<bool, TreeError> {
        if self.tree.has_stranded() {
            self.release_stranded(ctx, true).await;
        }
        let mut addr = self.find_level(ctx, key, 0).await?;
        for _ in 0..MAX_RESTARTS {
            let (held, buf) = self.lock_and_read(ctx, addr).await?;
            let (leaf, low, high, sibling) = {
                let n = self.node(buf.as_slice());
                (n.is_leaf(), n.low(), n.high(), n.sibling())
            };
            if !leaf || key < low || key >= high {
                self.write_and_release(ctx, held, &[], buf.as_slice())
                    .await?;
                if leaf && key >= high {
                    self.stats.sibling_hops += 1;
                    self.tree.cache.invalidate_covering(1, key);
                    addr = sibling;
                } else {
                    self.tree.cache.invalidate_covering(1, key);
                    self.root_hint = 0;
                    addr = self.find_level(ctx, key, 0).await?;
                }
                continue;
            }
            return self.change_leaf(ctx, held, addr, buf, key, value).await;
        }
        Err(TreeError::Corrupt {
            addr,
            why: "write restarted without end",
        })
    }

    /// Applies a put or delete to a locked leaf we just read (`buf`, handed
    /// on to a split, which lets it go before the levels above: see
    /// `split_leaf`), then writes back and unlocks (splitting if full).
    pub(super) async fn change_leaf<N: Nic>(
        &mut self,
        ctx: &Ctx<N>,
        held: Held,
        addr: GlobalAddr,
        mut buf: Buf,
        key: K,
        value: Option<&[u8]>,
    ) -> Result<bool, TreeError> {
        let whole = self.tree.cfg.whole_node_writes;
        let rear = self.tree.cfg.versions == VersionScheme::FrontRear;
        let slot = self.node(buf.as_slice()).find(key);
        let present = slot.is_some();
        if whole {
            // FG+: keep the leaf sorted and write it back whole.
            let mut items = LeafItems::of(&self.node(buf.as_slice()));
            items.remove(key);
            if let Some(v) = value {
                items.push(key, v);
            }
            items.sort();
            if items.len() > self.layout.leaf_fanout() {
                return self
                    .split_leaf(ctx, held, addr, buf, items)
                    .await
                    .map(|_| present);
            }
            let mut m = self.node_mut(buf.as_mut_slice());
            let v = m.view().version().wrapping_add(1);
            items.fill(&mut m, 0..items.len());
            m.set_version(v);
            let page = self.node(buf.as_slice()).bytes();
            self.write_and_release(ctx, held, &[(addr, page)], page)
                .await?;
            return Ok(present);
        }
        let target = match (slot, value) {
            (Some(i), Some(v)) => {
                self.node_mut(buf.as_mut_slice()).set_entry(i, key, v);
                i
            }
            (Some(i), None) => {
                self.node_mut(buf.as_mut_slice()).clear_entry(i);
                i
            }
            (None, None) => {
                self.write_and_release(ctx, held, &[], buf.as_slice())
                    .await?;
                return Ok(false);
            }
            (None, Some(v)) => match self.node(buf.as_slice()).free_slot() {
                Some(i) => {
                    self.node_mut(buf.as_mut_slice()).set_entry(i, key, v);
                    i
                }
                None => {
                    let mut items = LeafItems::of(&self.node(buf.as_slice()));
                    items.push(key, v);
                    items.sort();
                    return self
                        .split_leaf(ctx, held, addr, buf, items)
                        .await
                        .map(|_| false);
                }
            },
        };
        let (off, len) = self.layout.leaf_entry_write(target, rear);
        let entry = &buf.as_slice()[off..off + len];
        let page = buf.as_slice();
        self.write_and_release(ctx, held, &[(addr.add(off as u64), entry)], page)
            .await?;
        Ok(present)
    }
}
