//! Running a backend-specific path behind a generic `B: Backend`, chosen by `TypeId` at run time.
//!
//! Burn 0.21 gives a generic `B: Backend` no custom autodiff operation without an extra trait
//! bound on every model, so the operations with their own backward pass ([`crate::recurrence`],
//! [`crate::conv_max`]) compare `TypeId::of::<B>()` with the backends they know and then move
//! their tensors across with [`same_type`].

use std::any::Any;

/// `value` as a `T`; `A` and `T` must be the same type (checked by the caller's `TypeId`).
pub(crate) fn same_type<A: 'static, T: 'static>(value: A) -> T {
    let mut slot = Some(value);
    let cast = (&mut slot as &mut dyn Any).downcast_mut::<Option<T>>().expect("the caller checked that the types are the same");
    cast.take().expect("the slot was filled above")
}
