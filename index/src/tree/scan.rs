//! Range scans: leaves in key order along their right-sibling links.

use super::*;

impl TreeClient {
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
        low: u64,
        high: u64,
        limit: usize,
    ) -> Result<Vec<(u64, u64)>, TreeError> {
        crate::scratch_scoped(ctx, self.scan_unscoped(ctx, low, high, limit)).await
    }

    pub(super) async fn scan_unscoped<N: Nic>(
        &mut self,
        ctx: &Ctx<N>,
        low: u64,
        high: u64,
        limit: usize,
    ) -> Result<Vec<(u64, u64)>, TreeError> {
        let mut out = Vec::new();
        if low >= high || limit == 0 {
            return Ok(out);
        }
        let mut addr = self.find_level(ctx, low, 0).await?;
        let mut from = low;
        for _ in 0..MAX_RESTARTS {
            let buf = self.read_node(ctx, addr).await?;
            let n = Node(buf.as_slice());
            if !n.is_leaf() || from < n.low() {
                self.tree.cache.invalidate_covering(1, from);
                self.root_hint = 0;
                addr = self.find_level(ctx, from, 0).await?;
                continue;
            }
            if from >= n.high() {
                self.stats.sibling_hops += 1;
                addr = n.sibling();
                continue;
            }
            let mut part: Vec<(u64, u64)> = n
                .entries()
                .filter(|&(k, _)| k >= from && k < high)
                .collect();
            part.sort_unstable();
            out.extend(part);
            if out.len() >= limit {
                out.truncate(limit);
                return Ok(out);
            }
            if n.high() >= high || n.sibling().is_null() {
                return Ok(out);
            }
            from = n.high();
            addr = n.sibling();
        }
        Err(TreeError::Corrupt {
            addr,
            why: "scan restarted without end",
        })
    }
}
