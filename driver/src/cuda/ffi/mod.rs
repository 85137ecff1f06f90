//! Every foreign function symm calls, one module per library.
//!
//! Each library's entry points are loaded at run time into a table of function pointers whose
//! return type is a plain `i32`: a result code stays an integer until [`super::error`] matches it,
//! so a code this build does not know (a newer driver) is data, never undefined behaviour.
//!
//! * [`driver`]: libcuda, located through cudarc's loader.
//! * [`nvrtc`]: libnvrtc, from a path or cudarc's search list.
//! * [`nccl`]: libnccl, located through cudarc's loader (benchmarks only).

pub mod driver;
pub mod nccl;
pub mod nvrtc;

/// Declares a table of entry points loaded from a `libloading::Library`.
macro_rules! api_table {
    (@ret) => { i32 };
    (@ret $ret:ty) => { $ret };
    ($(#[$m:meta])* $name:ident { $( $field:ident = $sym:literal ( $($arg:ty),* ) $(-> $ret:ty)? ; )* }) => {
        $(#[$m])*
        #[allow(non_snake_case, missing_docs)]
        pub struct $name {
            $( pub $field: unsafe extern "C" fn($($arg),*) -> api_table!(@ret $($ret)?), )*
        }

        impl $name {
            /// Loads every entry point, naming the first missing symbol.
            ///
            /// # Safety
            /// `lib` must be the library these signatures describe.
            pub unsafe fn load(lib: &libloading::Library) -> Result<Self, &'static str> {
                Ok($name {
                    $(
                        // SAFETY: the caller guarantees the library matches the declared
                        // signature; the pointer is copied out while `lib` is alive and the
                        // caller keeps `lib` loaded as long as the table.
                        $field: unsafe {
                            *lib.get::<unsafe extern "C" fn($($arg),*) -> api_table!(@ret $($ret)?)>(
                                concat!($sym, "\0").as_bytes(),
                            )
                            .map_err(|_| $sym)?
                        },
                    )*
                })
            }
        }
    };
}
pub(crate) use api_table;
