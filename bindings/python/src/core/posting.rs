//! Endpoints and posting: a batch's SQEs pushed into the queue pair, the
//! GIL released while the SQ is full.

use super::*;

impl Core {
    pub(crate) fn add_endpoint(&self, ep: EndpointId) {
        lock(&self.endpoints).insert(ep.as_raw());
    }

    pub(crate) fn remove_endpoint(&self, ep: EndpointId) {
        lock(&self.endpoints).remove(&ep.as_raw());
    }

    /// Pushes `sqes` (their `user_data` are set here) as one transfer, with
    /// staged payloads where `payloads` has one (by index); submits them.
    /// Waits for room while the SQ is full. Returns the transfer.
    pub(crate) fn post(
        &self,
        sqes: &[Sqe],
        payloads: &[(usize, Vec<u8>)],
        keep: Option<Arc<Keep>>,
    ) -> Res<TransferId> {
        let (result, released) = {
            let w = self.worker()?;
            let w = w.as_ref().expect("checked by worker()");
            let mut guard = self.queue();
            let result = self.post_locked(w, &mut guard, sqes, payloads, keep);
            (result, std::mem::take(&mut guard.book.released))
        };
        // With no lock held: see `Book::released`.
        drop(released);
        result
    }

    /// Unlocks the queue, then drops what finished transfers kept: for
    /// `close`, whose worker lock is no obstacle (a closed worker's
    /// memory does not take it again).
    pub(super) fn unlock(&self, mut guard: MutexGuard<'_, Queue>) {
        let released = std::mem::take(&mut guard.book.released);
        drop(guard);
        drop(released);
    }

    pub(super) fn post_locked(
        &self,
        w: &Worker,
        guard: &mut MutexGuard<'_, Queue>,
        sqes: &[Sqe],
        payloads: &[(usize, Vec<u8>)],
        keep: Option<Arc<Keep>>,
    ) -> Res<TransferId> {
        let q = &mut **guard;
        let qp = q.qp.as_mut().ok_or_else(Fail::closed)?;
        let book = &mut q.book;
        let n = u32::try_from(sqes.len()).map_err(|_| Fail::invalid("too many operations"))?;
        let id = book.new_transfer(n, keep);
        let mut ready: Vec<Sqe> = Vec::with_capacity(sqes.len());
        let mut payloads = payloads.iter().peekable();
        for (i, sqe) in sqes.iter().enumerate() {
            let mut sqe = *sqe;
            let mut staged = None;
            if let Some((_, bytes)) = payloads.next_if(|(at, _)| *at == i) {
                match book.stage(w, bytes) {
                    Ok((slot, local)) => {
                        staged = Some(slot);
                        sqe.local_mem = local.mem;
                        sqe.local_addr = local.addr;
                    }
                    Err(f) => {
                        for s in &ready {
                            book.cancel_slot(s.user_data);
                        }
                        book.discard(id);
                        return Err(f);
                    }
                }
            }
            sqe.user_data = book.new_slot(id.index, i as u32, staged);
            ready.push(sqe);
        }
        let mut pushed = 0;
        let mut idle = 0u32;
        loop {
            let k = match qp.push_batch(&ready[pushed..]) {
                Ok(k) => k,
                Err(_) => {
                    qp.submit();
                    for (i, s) in ready.iter().enumerate().skip(pushed) {
                        book.cancel_slot(s.user_data);
                        book.settle(id, i as u32, Status::RingCorrupt.as_raw());
                    }
                    return Err(corrupt());
                }
            };
            book.pushed(k);
            pushed += k;
            qp.submit();
            if pushed == ready.len() {
                return Ok(id);
            }
            // The SQ is full: make room (completions must be reaped for
            // the engine to take more SQEs once the CQ fills).
            if self.is_closed() {
                for (i, s) in ready.iter().enumerate().skip(pushed) {
                    book.cancel_slot(s.user_data);
                    book.settle(id, i as u32, Status::Canceled.as_raw());
                }
                return Ok(id);
            }
            let mut work = 0;
            if !self.core_thread {
                work += w.progress();
            }
            work += reap(qp, book)?;
            if work > 0 {
                self.signal(false);
                idle = 0;
            } else {
                backoff(&mut idle);
            }
        }
    }

    /// Pushes one SQE of the package's own (a CLOSE at close time), whose
    /// result goes nowhere.
    pub(super) fn post_internal(&self, sqe: Sqe) {
        let mut guard = self.queue();
        let q = &mut *guard;
        let Some(qp) = q.qp.as_mut() else { return };
        let mut sqe = sqe;
        sqe.user_data = q.book.new_slot(INTERNAL, 0, None);
        if qp.push(sqe).is_ok() {
            q.book.pushed(1);
            qp.submit();
        } else {
            q.book.cancel_slot(sqe.user_data);
        }
    }
}
