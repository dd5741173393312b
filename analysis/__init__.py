"""The one layer between the results store and its readers: `loopeval results`, the static report and the Dash app
read the plotted point (`points`), rank it and mark its frontier (`ranking`), name it (`names`), answer in one
sentence (`answer`) and list the runs behind it (`runs`) through here, from `db.queries`' DataFrames."""
