//! HOCL, Sherman's hierarchical on-chip lock (§4.2): a global table of
//! 8-byte lock words in each memory node's device memory, taken by one
//! remote CAS, and a local table per compute node through which the node's
//! own threads take a lock before any of them tries remotely, so they do
//! not fight over the NIC. With wait queues (as Sherman) waiters are served
//! in FIFO order, and a releasing holder can hand the lock to the next
//! local waiter without releasing it remotely — up to `max_handover` times
//! in a row, then it releases remotely so other compute nodes are not
//! starved. Without them (the step before wait queues in Sherman §5.7) an
//! entry is a test-and-set word: whichever local thread tries first after a
//! release takes it, a newcomer as well as one that waited.
//!
//! A lock protects a tree node; lock index = hash(node address) mod table
//! size, so unrelated nodes may share a lock (never a problem: a client
//! holds one lock at a time). As in Sherman's code, the local table mirrors
//! the global tables: one local entry per global word of each memory node
//! (memory nodes beyond [`LOCAL_NODE_SLOTS`] share slots by id modulo), so
//! a local queue only ever holds waiters for its own global word and a hot
//! lock's queue never delays writers of unrelated nodes. Where entries are
//! shared anyway (more memory nodes than slots, or locks in node headers
//! hashed into the table), a local entry remembers which global word it
//! holds, and a holder handed an entry that holds another word releases
//! that word before taking its own. The local table is shared by every
//! thread of the compute node, so its words are atomics; a memory node's
//! part is allocated when first used.

use super::config::TreeConfig;
use super::layout::OFF_LOCK;
use nicdrv::{GlobalAddr, Space};
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::{Mutex, OnceLock};

/// Memory nodes with a local table part of their own; more share by id
/// modulo this.
pub const LOCAL_NODE_SLOTS: usize = 16;

/// The per-compute-node lock queue state of one lock index.
struct LocalLock {
    next_ticket: AtomicU32,
    now_serving: AtomicU32,
    /// The entry's test-and-set word, without wait queues: held by a local
    /// thread.
    taken: AtomicBool,
    /// This compute node holds the global lock on behalf of its queue.
    remote_held: AtomicBool,
    /// The global lock word held (raw address) while `remote_held`.
    held_word: AtomicU64,
    /// What that word holds: the id of the client whose CAS took it (a
    /// handover leaves the word as it is).
    held_by: AtomicU64,
    handovers: AtomicU32,
    /// The node a holder handing the lock over left with it (raw address
    /// and bytes as they are at the memory node), when the configuration
    /// hands pages over. Set by a handover and moved out to the next
    /// holder at its turn (`on_turn`), whatever it does with it, so a page
    /// lives only while the lock it came with is held: a compute node holds
    /// at most one page per client holding a lock.
    page: Mutex<Page>,
}

/// A node's bytes handed over with its lock.
#[derive(Default)]
pub struct Page {
    /// Raw address of the node `bytes` holds; 0: none.
    node: u64,
    bytes: Vec<u8>,
}

impl Page {
    /// Copies the page into `into` if it is of the node at `node` (a lock
    /// covers every node its word hashes from) and of `into`'s size.
    pub fn copy_to(&self, node: GlobalAddr, into: &mut [u8]) -> bool {
        let ours = self.node == node.raw() && self.node != 0 && self.bytes.len() == into.len();
        if ours {
            into.copy_from_slice(&self.bytes);
        }
        ours
    }
}

/// The local lock table of one compute node: `entries` per memory-node
/// slot, each slot's part allocated on first use.
pub struct LocalLocks {
    parts: Box<[OnceLock<Box<[LocalLock]>>]>,
    entries: usize,
}

impl LocalLocks {
    pub fn new(entries: usize) -> LocalLocks {
        LocalLocks {
            parts: (0..LOCAL_NODE_SLOTS).map(|_| OnceLock::new()).collect(),
            entries: entries.max(1),
        }
    }

    /// Entries per memory-node slot.
    pub fn entries(&self) -> usize {
        self.entries
    }

    fn at(&self, i: usize) -> &LocalLock {
        let part = self.parts[(i / self.entries) % LOCAL_NODE_SLOTS].get_or_init(|| {
            (0..self.entries)
                .map(|_| LocalLock {
                    next_ticket: AtomicU32::new(0),
                    now_serving: AtomicU32::new(0),
                    taken: AtomicBool::new(false),
                    remote_held: AtomicBool::new(false),
                    held_word: AtomicU64::new(0),
                    held_by: AtomicU64::new(0),
                    handovers: AtomicU32::new(0),
                    page: Mutex::new(Page::default()),
                })
                .collect()
        });
        &part[i % self.entries]
    }
}

/// Where a node's lock lives and which local queue guards it.
#[derive(Copy, Clone, Debug)]
pub struct LockRef {
    pub word: GlobalAddr,
    pub local: usize,
}

fn mix(a: u64) -> u64 {
    let mut z = a.wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// The lock of the tree node at `node`.
pub fn lock_of(
    cfg: &TreeConfig,
    table_words: u64,
    local_entries: usize,
    node: GlobalAddr,
) -> LockRef {
    let h = mix(node.raw());
    let slot = node.node() as usize % LOCAL_NODE_SLOTS;
    let (word, local) = if cfg.lock_in_dm {
        // One local entry per global word (local_entries >= table_words).
        let w = h % table_words;
        (
            GlobalAddr::new(node.node(), Space::Device, w * 8),
            w as usize,
        )
    } else {
        (
            node.add(OFF_LOCK as u64),
            (h % local_entries as u64) as usize,
        )
    };
    LockRef {
        word,
        local: slot * local_entries + local,
    }
}

/// How a client holds its local entry.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub enum Turn {
    /// Ticket `t` of the entry's FIFO wait queue, now served.
    Ticket(u32),
    /// The entry's test-and-set word (no wait queues).
    Taken,
}

/// What a local acquire found.
pub enum Local {
    /// The previous local holder handed the global lock over: no remote
    /// CAS; with the page it left, if any, and what the word holds (the
    /// id of the client whose CAS took it).
    HandedOver(Option<Page>, u64),
    /// This thread must take the global lock itself.
    MustAcquire,
    /// The entry holds another global word (a hash collision across memory
    /// nodes), holding the id given: release it, then take ours.
    ReleaseFirst(GlobalAddr, u64),
}

impl LocalLocks {
    /// Takes a ticket; the caller then waits with [`is_turn`](Self::is_turn).
    pub fn ticket(&self, i: usize) -> u32 {
        // Relaxed: the ticket counter only orders waiters among themselves;
        // the hand-off itself is published through now_serving.
        self.at(i).next_ticket.fetch_add(1, Ordering::Relaxed)
    }

    /// A ticket of entry `i` that is its turn at once, if nobody holds or
    /// waits for the entry; `None` (and no ticket taken) otherwise.
    pub fn try_ticket(&self, i: usize) -> Option<u32> {
        let l = self.at(i);
        // Acquire pairs with the Release in `pass`, as `is_turn` does.
        let serving = l.now_serving.load(Ordering::Acquire);
        // Ticket `serving` is only ever taken once (the counter moves on),
        // and the entry cannot be served past it before its holder passes
        // it: taking it is taking the turn. Relaxed: the load above ordered
        // what the turn reads.
        l.next_ticket
            .compare_exchange(
                serving,
                serving.wrapping_add(1),
                Ordering::Relaxed,
                Ordering::Relaxed,
            )
            .ok()
    }

    /// Takes entry `i`'s test-and-set word if it is free (no wait queues);
    /// the caller retries later when not.
    pub fn try_take(&self, i: usize) -> bool {
        // Acquire pairs with the Release in `pass`, as `is_turn` does.
        // Relaxed on failure: nothing is read under a lock not taken.
        self.at(i)
            .taken
            .compare_exchange(false, true, Ordering::Acquire, Ordering::Relaxed)
            .is_ok()
    }

    /// True when ticket `t` may go.
    pub fn is_turn(&self, i: usize, t: u32) -> bool {
        // Acquire pairs with the Release in `pass`, so the new holder
        // sees remote_held/handovers as the previous holder left them.
        self.at(i).now_serving.load(Ordering::Acquire) == t
    }

    pub fn on_turn(&self, i: usize, word: GlobalAddr) -> Local {
        let l = self.at(i);
        if !l.remote_held.load(Ordering::Relaxed) {
            return Local::MustAcquire;
        }
        // Handed over: whatever page came with the entry leaves it now, to
        // this holder (dropped with it, unless it is the node it locks).
        let page = std::mem::take(&mut *l.page.lock().expect("no panics hold a page"));
        let held = GlobalAddr::from_raw(l.held_word.load(Ordering::Relaxed));
        let by = l.held_by.load(Ordering::Relaxed);
        if held == word {
            Local::HandedOver((page.node != 0).then_some(page), by)
        } else {
            l.remote_held.store(false, Ordering::Relaxed);
            l.handovers.store(0, Ordering::Relaxed);
            Local::ReleaseFirst(held, by)
        }
    }

    /// Records that this compute node holds global word `word`, taken by
    /// the CAS of client `by` (what the word holds). Relaxed: read only by
    /// the entry's next holder, after `pass`'s Release.
    pub fn set_remote_held(&self, i: usize, word: GlobalAddr, by: u64) {
        let l = self.at(i);
        l.held_word.store(word.raw(), Ordering::Relaxed);
        l.held_by.store(by, Ordering::Relaxed);
        l.remote_held.store(true, Ordering::Relaxed);
    }

    /// Decides how the holder of `turn` releases: true to hand over (keep
    /// the global lock for the next local waiter), false to release
    /// remotely. Call before writing back; then call [`pass`](Self::pass).
    /// Only a queue has a next waiter: a test-and-set holder never hands
    /// over.
    pub fn plan_release(&self, i: usize, turn: Turn, max_handover: u32, handover: bool) -> bool {
        let l = self.at(i);
        let waiters = match turn {
            Turn::Ticket(t) => {
                l.next_ticket
                    .load(Ordering::Relaxed)
                    .wrapping_sub(t.wrapping_add(1))
                    > 0
            }
            Turn::Taken => false,
        };
        let give = handover && waiters && l.handovers.load(Ordering::Relaxed) < max_handover;
        if give {
            l.handovers.fetch_add(1, Ordering::Relaxed);
        } else {
            l.handovers.store(0, Ordering::Relaxed);
            l.remote_held.store(false, Ordering::Relaxed);
        }
        give
    }

    /// Leaves the node at `node` (its bytes as the memory node holds them
    /// once the holder's writes land), or none, to the local waiter the
    /// holder of entry `i` hands the lock over to. Call before
    /// [`pass`](Self::pass).
    pub fn leave_page(&self, i: usize, page: Option<(GlobalAddr, &[u8])>) {
        let mut p = self.at(i).page.lock().expect("no panics hold a page");
        match page {
            Some((node, bytes)) => {
                p.node = node.raw();
                p.bytes.clear();
                p.bytes.extend_from_slice(bytes);
            }
            None => *p = Page::default(),
        }
    }

    /// Whether entry `i` holds a page's buffer (for tests of the bound).
    #[cfg(test)]
    fn holds_page(&self, i: usize) -> bool {
        self.at(i)
            .page
            .lock()
            .expect("no panics hold a page")
            .bytes
            .capacity()
            > 0
    }

    /// Lets the next local waiter go (after the holder's writes completed).
    pub fn pass(&self, i: usize, turn: Turn) {
        // Release: the next holder (Acquire in is_turn or try_take) sees
        // our updates of remote_held and handovers.
        let l = self.at(i);
        match turn {
            Turn::Ticket(t) => l.now_serving.store(t.wrapping_add(1), Ordering::Release),
            Turn::Taken => l.taken.store(false, Ordering::Release),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_ticket_taken_at_once_is_the_turn_and_only_on_an_idle_entry() {
        let locks = LocalLocks::new(2);
        assert_eq!(locks.try_ticket(1), Some(0), "idle: the turn");
        assert!(locks.is_turn(1, 0));
        assert_eq!(locks.try_ticket(1), None, "held");
        let waiter = locks.ticket(1);
        locks.pass(1, Turn::Ticket(0));
        assert!(locks.is_turn(1, waiter));
        assert_eq!(locks.try_ticket(1), None, "the waiter's turn");
        assert_eq!(locks.try_ticket(0), Some(0), "entries are apart");
        locks.pass(1, Turn::Ticket(waiter));
        assert_eq!(locks.try_ticket(1), Some(waiter + 1), "idle again");
        assert_eq!(locks.ticket(1), waiter + 2, "no ticket skipped");
    }

    #[test]
    fn a_test_and_set_entry_is_held_once_and_never_handed_over() {
        let locks = LocalLocks::new(4);
        let w = GlobalAddr::new(1, Space::Device, 8);
        assert!(locks.try_take(2));
        assert!(!locks.try_take(2), "held");
        assert!(locks.try_take(3), "entries are apart");
        // Without a queue there is no next waiter to hand over to: the
        // holder releases the global word, and the next taker takes it.
        locks.set_remote_held(2, w, 7);
        assert!(!locks.plan_release(2, Turn::Taken, 8, true));
        locks.pass(2, Turn::Taken);
        assert!(locks.try_take(2), "free again");
        assert!(matches!(locks.on_turn(2, w), Local::MustAcquire));
    }

    #[test]
    fn a_page_goes_once_to_a_waiter_for_its_own_node() {
        let locks = LocalLocks::new(4);
        let a = GlobalAddr::new(1, Space::Host, 1024);
        let b = GlobalAddr::new(1, Space::Host, 2048);
        let mut into = [0u8; 8];
        let (wa, wb) = (
            GlobalAddr::new(1, Space::Device, 8),
            GlobalAddr::new(17, Space::Device, 8),
        );
        // The turn of a holder handed entry 3 for word `wa`: the page it
        // gets, which leaves the entry then.
        let handed = || {
            locks.set_remote_held(3, wa, 7);
            match locks.on_turn(3, wa) {
                Local::HandedOver(page, by) => {
                    assert_eq!(by, 7, "the word's holder goes with it");
                    page
                }
                _ => panic!("handed over"),
            }
        };
        // Nothing left yet.
        assert!(handed().is_none());
        locks.leave_page(3, Some((a, &[7u8; 8])));
        // Another node sharing the lock gets nothing, and the page is gone.
        assert!(!handed().unwrap().copy_to(b, &mut into));
        assert!(handed().is_none());
        locks.leave_page(3, Some((a, &[9u8; 8])));
        assert!(handed().unwrap().copy_to(a, &mut into));
        assert_eq!(into, [9u8; 8]);
        assert!(handed().is_none(), "taken once");
        // A holder whose writes failed leaves none.
        locks.leave_page(3, Some((a, &[1u8; 8])));
        locks.leave_page(3, None);
        assert!(handed().is_none());
        // A page of another size is not taken.
        locks.leave_page(3, Some((a, &[1u8; 4])));
        assert!(!handed().unwrap().copy_to(a, &mut into));
        // No buffer outlives its page: taken, refused or withdrawn.
        assert!(!locks.holds_page(3));
        locks.leave_page(3, Some((a, &[5u8; 8])));
        assert!(locks.holds_page(3));
        locks.leave_page(3, None);
        assert!(!locks.holds_page(3));
        // Handed an entry holding another node's word (entries shared
        // across memory nodes): the page of that word's node goes with it.
        locks.set_remote_held(3, wa, 9);
        locks.leave_page(3, Some((a, &[5u8; 8])));
        assert!(matches!(locks.on_turn(3, wb), Local::ReleaseFirst(w, 9) if w == wa));
        assert!(!locks.holds_page(3));
    }
}
