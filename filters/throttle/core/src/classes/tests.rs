//! The class queue's pure parts, exact: floor slots, the choice of class,
//! the shared value's changes, grants and passing on, and the estimates.

use std::cell::RefCell;

use super::tickets::{self, Abandoned, Settled, Tickets};
use super::*;
use crate::clock::{NS_PER_MS, NS_PER_S};
use crate::config::Class;
use crate::matcher::Match;
use crate::rate::{Gcra as RateSlots, Outlook, RateSource as Slots};
use crate::schedule::Schedule;
use crate::testing::{MemBlob, MemCell};

const MS: u64 = NS_PER_MS;

fn class(name: &str, ppm: u32) -> Class {
    Class {
        name: name.into(),
        matcher: Some(Match::default()),
        min_share_ppm: ppm,
        max_delay_ns: NS_PER_S,
    }
}

/// critical, normal, batch (floor 10%).
fn three() -> Vec<Class> {
    vec![
        class("critical", 0),
        class("normal", 0),
        class("batch", 100_000),
    ]
}

fn waiting(w: &[u64]) -> [u64; MAX] {
    let mut out = [0; MAX];
    out[..w.len()].copy_from_slice(w);
    out
}

/// A small reproducible generator for the exhaustive floor checks.
fn xorshift(mut seed: u64) -> impl FnMut() -> u64 {
    move || {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        seed
    }
}

#[test]
fn floor_slots_come_at_the_class_share_over_any_window() {
    let classes = vec![class("a", 0), class("b", 250_000), class("c", 100_000)];
    let all = waiting(&[1, 1, 1]);
    for start in [0u64, 1, 977, 1 << 40, u64::MAX - 20_000] {
        for n in [10u64, 100, 1000, 20_000] {
            let count = |c: usize| {
                (0..n)
                    .filter(|k| floor_of(start.wrapping_add(*k), &classes, &all) == Some(c))
                    .count() as u64
            };
            let (b, c) = (count(1), count(2));
            assert!(b <= floor_slots_at_most(250_000, n), "{start} {n}: {b}");
            assert!(c <= floor_slots_at_most(100_000, n), "{start} {n}: {c}");
            // And at least the share, less the same discrepancy.
            let slack = floor_slots_at_most(250_000, n) - (250_000 * n).div_ceil(1_000_000);
            assert!(b + slack + 1 >= n / 4, "{start} {n}: {b}");
            assert_eq!(count(0), 0, "a class without min_share has no floor slots");
        }
    }
}

/// The bound [`floor_slots_at_most`] promises, checked for every window of
/// up to 40,000 slots from many starts and shares.
#[test]
fn the_floor_bound_holds_for_long_windows() {
    let mut next = xorshift(0x1234_5678_u64);
    for _ in 0..40 {
        let before = (next() % 500_000) as u32;
        let ppm = (next() % 500_000) as u32 + 1;
        let classes = vec![class("x", before), class("y", ppm)];
        let start = next();
        let w = waiting(&[1, 1]);
        let mut count = 0u64;
        for n in 1..=40_000u64 {
            if floor_of(start.wrapping_add(n - 1), &classes, &w) == Some(1) {
                count += 1;
            }
            assert!(
                count <= floor_slots_at_most(ppm, n),
                "ppm {ppm} n {n}: {count}"
            );
        }
    }
}

#[test]
fn a_slot_goes_to_its_floor_class_if_it_waits_else_to_the_highest_waiting() {
    let classes = three();
    let floor = (0..1000u64)
        .find(|&i| floor_of(i, &classes, &waiting(&[1, 1, 1])) == Some(2))
        .unwrap();
    let plain = (0..1000u64)
        .find(|&i| floor_of(i, &classes, &waiting(&[1, 1, 1])).is_none())
        .unwrap();
    assert_eq!(choose(floor, &classes, &waiting(&[3, 2, 1])), Some(2));
    assert_eq!(
        choose(floor, &classes, &waiting(&[3, 2, 0])),
        Some(0),
        "batch does not wait"
    );
    assert_eq!(choose(plain, &classes, &waiting(&[3, 2, 1])), Some(0));
    assert_eq!(choose(plain, &classes, &waiting(&[0, 2, 1])), Some(1));
    assert_eq!(choose(plain, &classes, &waiting(&[0, 0, 0])), None);
    // A new request goes at once only if nobody at or above it waits and the
    // slot is no floor slot of a lower class waiting.
    assert!(may_go_now(plain, 0, &classes, &waiting(&[0, 5, 5])));
    assert!(!may_go_now(floor, 0, &classes, &waiting(&[0, 5, 5])));
    assert!(may_go_now(floor, 0, &classes, &waiting(&[0, 5, 0])));
    assert!(
        !may_go_now(plain, 1, &classes, &waiting(&[0, 1, 0])),
        "FIFO in a class"
    );
    assert!(!may_go_now(plain, 2, &classes, &waiting(&[1, 0, 0])));
    assert!(may_go_now(floor, 2, &classes, &waiting(&[0, 0, 0])));
}

#[test]
fn the_shared_value_round_trips_and_rejects_garbage() {
    let mut t = Tickets {
        window: 77,
        ..Tickets::default()
    };
    t.lines[0] = Line {
        next: 9,
        granted: 4,
        abandoned: 2,
        arrived: 3,
        arrived_before: 5,
    };
    t.lines[7].next = u64::MAX;
    let bytes = t.encode();
    assert_eq!(bytes.len(), tickets::BYTES);
    assert_eq!(Tickets::decode(&bytes), Some(t));
    assert_eq!(Tickets::decode(&bytes[1..]), None);
    let mut bad = bytes.clone();
    bad[0] ^= 1;
    assert_eq!(Tickets::decode(&bad), None);
    assert_eq!(t.lines[0].waiting(), 3);
}

#[test]
fn arrival_rates_slide_over_two_windows() {
    let mut t = Tickets::default();
    let s = NS_PER_S;
    for i in 0..10 {
        t.arrive(1, 5 * s + i * 10 * MS);
    }
    assert_eq!(t.arrival_rate(1, 5 * s + 500 * MS), 10.0);
    // The next window: the previous count fades as the window goes on.
    t.arrive(1, 6 * s);
    assert_eq!(t.arrival_rate(1, 6 * s), 11.0);
    assert_eq!(t.arrival_rate(1, 6 * s + 500 * MS), 6.0);
    assert_eq!(t.arrival_rate(1, 7 * s + 500 * MS), 0.5);
    assert_eq!(t.arrival_rate(1, 9 * s), 0.0);
    // A gap of windows forgets everything.
    t.arrive(0, 20 * s);
    assert_eq!((t.lines[1].arrived, t.lines[1].arrived_before), (0, 0));
    assert_eq!(t.arrival_rate(0, 20 * s), 1.0);
}

/// 100/s, no burst: one slot every 10 ms.
fn rate_slots() -> RateSlots<MemCell> {
    RateSlots {
        cell: MemCell::default(),
        schedule: Schedule::new(10 * MS, 0, NS_PER_S),
        learned: false,
    }
}

/// A learned interval in the cell's first word paces the slots, and no take
/// or give-back erases it.
#[test]
fn a_learned_interval_paces_the_slots_and_stays() {
    let mut s = RateSlots {
        learned: true,
        ..rate_slots()
    };
    let t0 = 1000 * NS_PER_S;
    s.cell.v = Some([25 * MS, 0]); // learned: 40/s instead of 100/s
    assert_eq!(s.take_due(t0, false, &|_| true), Ok(Some(t0 / (25 * MS))));
    assert_eq!(s.cell.v, Some([25 * MS, t0 + 25 * MS]));
    assert_eq!(
        s.take_due(t0 + 10 * MS, false, &|_| true),
        Ok(None),
        "not due at 100/s"
    );
    assert_eq!(
        s.take_due(t0 + 25 * MS, false, &|_| true)
            .map(|x| x.is_some()),
        Ok(true)
    );
    s.give_back(None).unwrap();
    assert_eq!(
        s.cell.v,
        Some([25 * MS, t0 + 25 * MS]),
        "given back, the word kept"
    );
    let o = s.outlook(t0 + 30 * MS, false).unwrap();
    assert_eq!(o.interval_ns, 25 * MS);
    // Not learned: the configured interval, the first word kept all the same.
    let mut plain = rate_slots();
    plain.cell.v = Some([25 * MS, 0]);
    assert!(plain.take_due(t0, false, &|_| true).unwrap().is_some());
    assert_eq!(plain.cell.v, Some([25 * MS, t0 + 10 * MS]));
}

#[test]
fn rate_slots_take_due_slots_in_virtual_time() {
    let mut s = rate_slots();
    let t0 = 1000 * MS;
    assert_eq!(s.take_due(t0, false, &|_| true), Ok(Some(100)));
    assert_eq!(
        s.take_due(t0 + 9 * MS, false, &|_| true),
        Ok(None),
        "next is due at +10ms"
    );
    // A tick 15 ms late (within the catch-up) takes every slot due, each at
    // its own time.
    let late = t0 + 25 * MS;
    let got: Vec<_> = (0..3)
        .map(|_| s.take_due(late, true, &|_| true).unwrap())
        .collect();
    assert_eq!(got, vec![Some(101), Some(102), None]);
    assert_eq!(s.cell.v, Some([0, t0 + 30 * MS]));
    // Another 20 ms on: 103 and 104.
    let later = t0 + 45 * MS;
    let got: Vec<_> = (0..3)
        .map(|_| s.take_due(later, true, &|_| true).unwrap())
        .collect();
    assert_eq!(got, vec![Some(103), Some(104), None]);
    assert_eq!(s.cell.v, Some([0, t0 + 50 * MS]));
    // Not busy: the schedule restarts at now, as a rule without classes does.
    let idle = t0 + 500 * MS;
    assert_eq!(s.take_due(idle, false, &|_| true), Ok(Some(150)));
    // A refused slot is not taken.
    assert_eq!(s.take_due(idle + 10 * MS, false, &|_| false), Ok(None));
    assert_eq!(s.cell.v, Some([0, idle + 10 * MS]));
    s.give_back(None).unwrap();
    assert_eq!(s.cell.v, Some([0, idle]));
    let o = s.outlook(idle + 3 * MS, false).unwrap();
    // The slot taken next is index tat / T; the schedule's slots are known.
    assert_eq!(
        o,
        Outlook {
            known: Some((idle / (10 * MS), u64::MAX, 10 * MS)),
            ..Outlook::every(idle + 3 * MS, 10 * MS)
        }
    );
    assert_eq!(o.per_s, 100.0);
    // Busy, a slot older than the catch-up is forfeited.
    let stall = idle + CATCH_UP_NS + 50 * MS;
    assert_eq!(
        s.take_due(stall, true, &|_| true),
        Ok(Some((stall - CATCH_UP_NS) / (10 * MS)))
    );
}

/// A shared value in memory.
fn blob() -> MemBlob {
    MemBlob::default()
}

fn ticket(b: &mut MemBlob, c: usize, now: u64) -> u64 {
    tickets::take_ticket(b, c, now, |_| true)
        .unwrap()
        .1
        .unwrap()
}

#[test]
fn due_slots_are_granted_by_class_and_the_total_is_the_rate() {
    let classes = three();
    let mut b = blob();
    let mut s = rate_slots();
    let t0 = 1000 * MS;
    // The schedule just gave a slot away (tat = t0 + 10ms).
    s.take_due(t0, false, &|_| true).unwrap();
    for _ in 0..5 {
        ticket(&mut b, 2, t0);
    }
    for _ in 0..3 {
        ticket(&mut b, 0, t0);
    }
    // Nothing is due yet.
    let g = tickets::grant_due(&mut b, &mut s, &classes, t0 + 5 * MS).unwrap();
    assert_eq!(g.per_class, [0; MAX]);
    // Ticks at 25 and 40 ms: 4 slots due, critical first (3), then batch.
    let g = tickets::grant_due(&mut b, &mut s, &classes, t0 + 25 * MS).unwrap();
    assert_eq!(g.per_class[0] + g.per_class[2], 2);
    let g = tickets::grant_due(&mut b, &mut s, &classes, t0 + 40 * MS).unwrap();
    assert_eq!(g.tickets.lines[0].granted, 3);
    assert_eq!(g.tickets.lines[2].granted, 1);
    assert_eq!(s.cell.v, Some([0, t0 + 50 * MS]));
    // With nobody waiting, nothing is taken.
    let mut empty = blob();
    let g = tickets::grant_due(&mut empty, &mut s, &classes, t0 + 900 * MS).unwrap();
    assert_eq!(g.per_class, [0; MAX]);
    assert_eq!(s.cell.v, Some([0, t0 + 50 * MS]));
}

#[test]
fn an_abandoned_ticket_is_skipped_or_its_grant_passed_on() {
    let classes = three();
    let mut b = blob();
    let mut s = rate_slots();
    let now = 1000 * MS;
    let (head, a, live) = (
        ticket(&mut b, 1, now),
        ticket(&mut b, 1, now),
        ticket(&mut b, 1, now),
    );
    // One behind the next in line is counted: three tickets, two waiting.
    assert_eq!(tickets::abandon(&mut b, 1, a), Ok(Abandoned::Counted));
    assert_eq!(tickets::load(&mut b).unwrap().0.waiting()[1], 2);
    // The next in line is skipped at once: no slot for it.
    assert_eq!(tickets::abandon(&mut b, 1, head), Ok(Abandoned::Skipped));
    assert_eq!(tickets::load(&mut b).unwrap().0.waiting()[1], 1);
    assert_eq!(
        tickets::settle(&mut b, &mut s, 1, a, true).unwrap().1,
        Settled::Skipped,
        "it is next in line now"
    );
    // Granting starts at the live one: one slot, one release.
    let g = tickets::grant_due(&mut b, &mut s, &classes, now).unwrap();
    assert_eq!((g.per_class[1], g.tickets.lines[1].granted), (1, 3));
    assert!(live < g.tickets.lines[1].granted);
    assert_eq!(s.cell.v, Some([0, now + 10 * MS]), "one slot taken in all");
    // The live one is abandoned after its grant: its slot goes back.
    assert_eq!(tickets::abandon(&mut b, 1, live), Ok(Abandoned::Granted));
    let (_, out) = tickets::settle(&mut b, &mut s, 1, live, false).unwrap();
    assert_eq!(out, Settled::GivenBack);
    assert_eq!(s.cell.v, Some([0, now]));
}

#[test]
fn a_grant_that_reaches_an_abandoned_ticket_is_passed_on() {
    let classes = three();
    let mut b = blob();
    let mut s = rate_slots();
    let now = 1000 * MS;
    let (first, gone, next) = (
        ticket(&mut b, 0, now),
        ticket(&mut b, 0, now),
        ticket(&mut b, 0, now),
    );
    assert_eq!(tickets::abandon(&mut b, 0, gone), Ok(Abandoned::Counted));
    // Two slots are due (at +10 and +20 ms): first, then (in ticket order)
    // the abandoned one.
    s.take_due(now, false, &|_| true).unwrap();
    let g = tickets::grant_due(&mut b, &mut s, &classes, now + 20 * MS).unwrap();
    assert_eq!(g.tickets.lines[0].granted, 2);
    assert!(first < 2 && next >= 2);
    let (t, out) = tickets::settle(&mut b, &mut s, 0, gone, true).unwrap();
    assert_eq!(out, Settled::PassedOn);
    assert_eq!(
        (
            t.lines[0].granted,
            t.lines[0].abandoned,
            t.lines[0].waiting()
        ),
        (3, 0, 0)
    );
    assert_eq!(
        s.cell.v,
        Some([0, now + 30 * MS]),
        "three slots, three live requests"
    );
}

/// A handle on a value in memory that several parties share.
struct Shared<'a>(&'a RefCell<MemBlob>);

impl crate::store::SharedBlob for Shared<'_> {
    type Token = u32;
    fn load(&mut self) -> Result<(Option<Vec<u8>>, u32), crate::store::StoreError> {
        self.0.borrow_mut().load()
    }
    fn store(&mut self, v: &[u8], token: u32) -> Result<bool, crate::store::StoreError> {
        self.0.borrow_mut().store(v, token)
    }
}

#[test]
fn a_slot_whose_class_emptied_meanwhile_goes_back() {
    use crate::store::StoreError;
    /// Another worker grants the only waiter while we take our slot.
    struct Racing<'a> {
        inner: RateSlots<MemCell>,
        other: Shared<'a>,
    }
    impl Slots for Racing<'_> {
        fn take_due(
            &mut self,
            now: u64,
            busy: bool,
            ok: &dyn Fn(u64) -> bool,
        ) -> Result<Option<u64>, StoreError> {
            let got = self.inner.take_due(now, busy, ok)?;
            tickets::update(&mut self.other, |t| {
                t.lines[0].granted += 1;
                Some(())
            })?;
            Ok(got)
        }
        fn give_back(&mut self, slot: Option<u64>) -> Result<(), StoreError> {
            self.inner.give_back(slot)
        }
        fn outlook(&mut self, now: u64, busy: bool) -> Result<Outlook, StoreError> {
            self.inner.outlook(now, busy)
        }
    }
    let value = RefCell::new(MemBlob::default());
    ticket(&mut value.borrow_mut(), 0, 0);
    let mut s = Racing {
        inner: rate_slots(),
        other: Shared(&value),
    };
    let g = tickets::grant_due(&mut Shared(&value), &mut s, &three(), 1000 * MS).unwrap();
    assert_eq!(g.per_class, [0; MAX], "we granted nothing");
    assert_eq!(g.tickets.lines[0].granted, 1, "the other worker did");
    assert_eq!(
        s.inner.cell.v,
        Some([0, 1000 * MS]),
        "our slot went back: due again now"
    );
}

fn backlog<'a>(classes: &'a [Class], t: &'a Tickets, next_at: u64, now: u64) -> Backlog<'a> {
    Backlog {
        classes,
        tickets: t,
        outlook: Outlook::every(next_at, 10 * MS),
        now,
    }
}

fn waiting_tickets(w: &[u64]) -> Tickets {
    let mut t = Tickets::default();
    for (c, &n) in w.iter().enumerate() {
        t.lines[c].next = n;
    }
    t
}

#[test]
fn a_single_class_turn_is_the_schedule_exactly() {
    let classes = vec![class("only", 0)];
    let t = waiting_tickets(&[4]);
    let now = 1000 * MS;
    let b = backlog(&classes, &t, now + 7 * MS, now);
    // Four wait: the fifth's slot is the fifth due: +7ms + 4 x 10ms.
    assert_eq!(turn_ns(&b, 0, 5, true), Some(47 * MS));
    assert_eq!(turn_ns(&b, 0, 1, true), Some(7 * MS));
}

/// A grid's owned slots come in ranges with gaps (other proxies' slots):
/// an admission walks every owned range, so a turn in a later range is
/// that slot's time, and a turn beyond all of them is reckoned after the
/// last (never taken as certain). Until issue 29 the walk saw only the
/// range at the cursor and reckoned the rest at the share rate from the
/// next slot on, which put turns among the owned slots that were not there
/// (fleet sweep seed 193: shares falling after the start's leftovers).
#[test]
fn a_turn_walks_every_owned_range_and_beyond_them_is_reckoned() {
    let classes = vec![class("only", 0)];
    let t = waiting_tickets(&[4]);
    let now = 1000 * MS;
    let mut b = backlog(&classes, &t, now + 2 * MS, now);
    // Slots 100..102 now (2 ms apart), then 150..152 and 200..201.
    b.outlook.known = Some((100, 2, 2 * MS));
    b.outlook.later[0] = (150, 152);
    b.outlook.later[1] = (200, 201);
    b.outlook.later_len = 2;
    b.outlook.later_all = true;
    b.outlook.certain_until = now + 2 * MS + 100 * 2 * MS;
    b.outlook.interval_ns = 10 * MS;
    // The 3rd and 4th in line: slots 150 and 151; the 5th: slot 200.
    assert_eq!(turn_ns(&b, 0, 3, true), Some(2 * MS + 50 * 2 * MS));
    assert_eq!(turn_ns(&b, 0, 5, true), Some(2 * MS + 100 * 2 * MS));
    // The 6th: after the last owned slot, reckoned.
    let sixth = turn_ns(&b, 0, 6, true).unwrap();
    assert!(sixth > 202 * MS, "{sixth}");
    assert!(
        !b.outlook.fits(now, sixth, 210 * MS, 100 * MS),
        "reckoned: the margin"
    );
    assert!(
        b.outlook.fits(now, 202 * MS, 210 * MS, 100 * MS),
        "owned: certain"
    );
    // Not every owned range listed: the rest is reckoned at the rate.
    b.outlook.later_all = false;
    assert_eq!(turn_ns(&b, 0, 6, true), Some(2 * MS + 5 * 10 * MS));
}

#[test]
fn turns_count_floors_below_and_arrivals_above() {
    let classes = three();
    let now = 1000 * MS;
    // 20 critical and 10 batch wait; nothing arrives.
    let t = waiting_tickets(&[20, 0, 10]);
    let b = backlog(&classes, &t, now, now);
    // Critical: the 21st waits for 20 slots at 90/s (batch keeps its 10/s floor).
    let crit = turn_ns(&b, 0, 21, false).unwrap();
    assert_eq!(crit, (20.0 / 90.0 * 1e9) as u64);
    // Admitting it, the floor slots may bunch: later by their discrepancy
    // over those 20 slots (3 slots, 30 ms).
    assert_eq!(
        turn_ns(&b, 0, 21, true),
        Some(crit + discrepancy(20) * 10 * MS)
    );
    assert_eq!(discrepancy(20), 3);
    // Batch: its 11th needs 10 slots; it gets 10/s while critical drains
    // (20 / 90 s, 2.2 slots), then all 100/s.
    let batch = turn_ns(&b, 2, 11, false).unwrap();
    let t1 = 20.0 / 90.0;
    let want = t1 + (10.0 - 10.0 * t1) / 100.0;
    assert_eq!(batch, (want * 1e9) as u64);
    // Normal (no floor) while critical arrives at 150/s above the rate: never.
    let mut hot = waiting_tickets(&[20, 0, 10]);
    for i in 0..150 {
        hot.arrive(0, now - NS_PER_S + i * 6 * MS);
    }
    let b = backlog(&classes, &hot, now, now);
    assert_eq!(turn_ns(&b, 1, 1, true), None);
    // Batch keeps its floor: its 11th in 10 / 10/s = 1 s.
    assert_eq!(turn_ns(&b, 2, 11, true), Some(NS_PER_S));
    // Without counting arrivals, normal would go after critical's backlog.
    assert!(turn_ns(&b, 1, 1, false).is_some());
}

#[test]
fn displacement_only_when_the_turn_cannot_come_in_time() {
    let classes = three();
    let now = 1000 * MS;
    // 100 critical wait; batch's 3rd waiter, deadline 1 s away: 101 slots
    // due by then, of which batch gets at most its floor slots (~10 + slack)
    // or 101 - 100 = 1.
    let t = waiting_tickets(&[100, 0, 5]);
    let b = backlog(&classes, &t, now, now);
    let most = floor_slots_at_most(100_000, 101);
    assert!(!cannot_make_it(&b, 2, most, now + NS_PER_S));
    assert!(cannot_make_it(&b, 2, most + 1, now + NS_PER_S));
    // Normal has no floor: the 2nd cannot make it, the 1st can.
    assert!(!cannot_make_it(&b, 1, 1, now + NS_PER_S));
    assert!(cannot_make_it(&b, 1, 2, now + NS_PER_S));
    // A deadline before the next slot: nothing can make it.
    let b = backlog(&classes, &t, now + 20 * MS, now);
    assert!(cannot_make_it(&b, 0, 1, now + 10 * MS));
    assert!(!cannot_make_it(&b, 0, 1, now + 20 * MS));
}

/// Invariant 6 (engine/README.md) asks a class that waits throughout for its
/// floor less one in every 1 s window: at 300 slots a second with both
/// classes always waiting, every 300 consecutive slots hold batch's 60 (the
/// golden-ratio sequence before 2026-11-29 gave 58 in some: the fleet
/// sweep's seed 42).
#[test]
fn a_class_waiting_throughout_gets_its_floor_less_one_in_any_second() {
    let classes = vec![class("critical", 0), class("batch", 200_000)];
    let both = waiting(&[1, 1]);
    let n = 300u64;
    let worst = (0..100_000u64)
        .map(|start| {
            let got = (start..start + n)
                .filter(|&i| choose(i, &classes, &both) == Some(1))
                .count() as u64;
            (got, start)
        })
        .min()
        .unwrap_or_default();
    assert!(
        worst.0 + 1 >= 60,
        "{n} slots from {}: batch got {}",
        worst.1,
        worst.0
    );
}

/// Two to seven classes with floors: each gets at most
/// [`floor_slots_at_most`] of any run of slots and at least its share less
/// the discrepancy and one, and the floor slots of all of them are their
/// summed share, rounded down or up.
#[test]
fn several_floors_each_hold_within_the_stated_discrepancy() {
    let mut next = xorshift(0x9E37_79B9_u64);
    let (mut worst_under, mut worst_over) = (0f64, 0f64);
    for _ in 0..60 {
        let floored = 2 + (next() % 6) as usize;
        let mut classes = vec![class("top", 0)];
        let mut left = 1_000_000u64;
        for i in 0..floored {
            let ppm = next() % (left / (floored - i) as u64 + 1);
            left -= ppm;
            classes.push(class(&format!("c{i}"), ppm as u32));
        }
        let all = waiting(&[1; 8][..classes.len()]);
        let start = next() >> 20;
        let n_max = 3_000u64;
        let mut counts = vec![0u64; classes.len()];
        let mut any = 0u64;
        for n in 1..=n_max {
            let owner = floor_of(start + n - 1, &classes, &all);
            if let Some(c) = owner {
                counts[c] += 1;
                any += 1;
            }
            let total: u64 = classes.iter().map(|c| u64::from(c.min_share_ppm)).sum();
            let exact = total as f64 * n as f64 / 1e6;
            assert!((any as f64 - exact).abs() < 1.0, "n {n}: {any} floor slots");
            for (c, class) in classes.iter().enumerate() {
                let want = f64::from(class.min_share_ppm) * n as f64 / 1e6;
                let d = discrepancy(n) as f64;
                worst_under = worst_under.max(want - counts[c] as f64);
                worst_over = worst_over.max(counts[c] as f64 - want);
                assert!(
                    counts[c] <= floor_slots_at_most(class.min_share_ppm, n)
                        && counts[c] as f64 + d + 1.0 >= want,
                    "{:?} from {start}, n {n}: class {c} got {}, share {want:.1}",
                    classes.iter().map(|c| c.min_share_ppm).collect::<Vec<_>>(),
                    counts[c]
                );
            }
        }
    }
    // Measured here: at most 3.4 under (a class after several others) and
    // 2.3 over; each split strays by less than one more.
    assert!(
        worst_under < 3.5 && worst_over < 3.5,
        "{worst_under} {worst_over}"
    );
}
